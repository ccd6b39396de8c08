#!/usr/bin/env bash
# scripts/mpirun, with MPIRUN pointed at a stub that prints its environment and arguments:
# Open MPI's keepalive on the daemons' connections is set by default (time 5, interval 2,
# 5 probes: a cut host ends the job about 15 s after the cut), each variable the user set
# is left alone, and the arguments reach the launcher unchanged.
#   bash tests/scripts/test_mpirun.sh
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
source "$ROOT/tests/scripts/lib.sh"
printf '#!/usr/bin/env bash\nenv\necho "args: $*"\n' >"$tmp/stub"
chmod +x "$tmp/stub"
keep=(OMPI_MCA_oob_tcp_keepalive_time OMPI_MCA_oob_tcp_keepalive_intvl OMPI_MCA_oob_tcp_keepalive_probes)

# 1. nothing set: the three defaults
env -u "${keep[0]}" -u "${keep[1]}" -u "${keep[2]}" MPIRUN="$tmp/stub" \
  "$ROOT/scripts/mpirun" -np 2 --bind-to none prog --x 1 >"$tmp/default.out" 2>&1
check "the launcher ran (exit 0)" test $? -eq 0
grep -E '^OMPI_MCA_oob_tcp_keepalive|^args:' "$tmp/default.out"
check "keepalive_time 5 by default" grep -qx "OMPI_MCA_oob_tcp_keepalive_time=5" "$tmp/default.out"
check "keepalive_intvl 2 by default" grep -qx "OMPI_MCA_oob_tcp_keepalive_intvl=2" "$tmp/default.out"
check "keepalive_probes 5 by default" grep -qx "OMPI_MCA_oob_tcp_keepalive_probes=5" "$tmp/default.out"
check "the arguments unchanged" grep -qx "args: -np 2 --bind-to none prog --x 1" "$tmp/default.out"

# 2. the user's own values win, each alone; the others keep their defaults
OMPI_MCA_oob_tcp_keepalive_time=60 MPIRUN="$tmp/stub" env -u "${keep[1]}" -u "${keep[2]}" \
  "$ROOT/scripts/mpirun" >"$tmp/time.out" 2>&1
check "a user's keepalive_time is left alone" grep -qx "OMPI_MCA_oob_tcp_keepalive_time=60" "$tmp/time.out"
check "...and the interval still set" grep -qx "OMPI_MCA_oob_tcp_keepalive_intvl=2" "$tmp/time.out"
OMPI_MCA_oob_tcp_keepalive_time=0 OMPI_MCA_oob_tcp_keepalive_intvl=7 OMPI_MCA_oob_tcp_keepalive_probes=3 \
  MPIRUN="$tmp/stub" "$ROOT/scripts/mpirun" >"$tmp/user.out" 2>&1
grep -E '^OMPI_MCA_oob_tcp_keepalive' "$tmp/user.out"
check "a user's keepalive_time 0 (keepalive off) is left alone" \
  grep -qx "OMPI_MCA_oob_tcp_keepalive_time=0" "$tmp/user.out"
check "a user's keepalive_intvl is left alone" grep -qx "OMPI_MCA_oob_tcp_keepalive_intvl=7" "$tmp/user.out"
check "a user's keepalive_probes is left alone" grep -qx "OMPI_MCA_oob_tcp_keepalive_probes=3" "$tmp/user.out"
check "each variable once" test "$(grep -c '^OMPI_MCA_oob_tcp_keepalive' "$tmp/user.out")" -eq 3
exit $status
