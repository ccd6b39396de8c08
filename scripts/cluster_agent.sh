#!/usr/bin/env bash
# The rsh agent of scripts/cluster.sh. Open MPI's mpirun calls it as `agent HOST CMD...` to
# start its daemon on HOST (as it would call ssh); it runs CMD, as a shell line like ssh's,
# inside that host's network namespace under the host's name.
host="$1"
shift
exec ip netns exec "${NDT_CLUSTER:-ndt}_$host" unshare --uts sh -c 'hostname "$0"; exec sh -c "$1"' "$host" "$*"
