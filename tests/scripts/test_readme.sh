#!/usr/bin/env bash
# The README's marked commands, run as written by a new user in a fresh copy of the repository:
# every fenced block right after a `<!-- readme-check -->` line, in order, each with
# `bash -e` in the copy's root. The copy holds what a clone holds (tracked files, and
# untracked ones git does not ignore, so that an edit is checked before its commit) and
# BUILD_DIR linked in as build/; every config in it is cut to 3 steps (2 validation batches),
# so the whole check takes a minute or two on 2 cores.
#
# The quick start's main job (scripts/train_fortunes.sh, out/fortunes/) runs one step first,
# as a user who followed the README from the top would have. Then: nothing was written outside
# out/ and data/; each block wrote only into run folders of its own (no file of an earlier run's
# folder changed, none added to it); the main job resumes its own checkpoint after the examples
# ran (they write elsewhere); and, as root where setpriv is there, the last marked block runs again as an
# ordinary user (nobody): the same lines must work for both.
#   bash tests/scripts/test_readme.sh BUILD_DIR
# Skipped (exit 77) without git, mpirun, the fortunes text, or the built programs.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$(cd "${1:-$ROOT/build}" 2>/dev/null && pwd)" || { echo "SKIPPED: no build folder ${1:-}"; exit 77; }
for p in train_gpt prepare_text generate; do  # generate: the chat walk-through
  [[ -x "$BUILD/$p" ]] || { echo "SKIPPED: $BUILD/$p is not built"; exit 77; }
done
command -v git >/dev/null && git -C "$ROOT" rev-parse --git-dir >/dev/null 2>&1 || { echo "SKIPPED: not a git checkout"; exit 77; }
command -v mpirun >/dev/null || { echo "SKIPPED: no mpirun"; exit 77; }
[[ -d /usr/share/games/fortunes ]] || { echo "SKIPPED: no fortunes text (scripts/setup.sh installs it)"; exit 77; }
# scripts/train_fortunes.sh runs scripts/setup.sh, which installs what is missing: not from a test
command -v dpkg-query >/dev/null || { echo "SKIPPED: no dpkg-query (scripts/setup.sh is for Debian/Ubuntu)"; exit 77; }
missing="$(bash -c 'eval "$(sed -n "/^PACKAGES=(/,/^)/p" "$1")"; for p in "${PACKAGES[@]}"; do
  [[ "$(dpkg-query -W -f="\${db:Status-Status}" "$p" 2>/dev/null)" == installed ]] || echo "$p"; done' _ "$ROOT/scripts/setup.sh")"
[[ -z "$missing" ]] || { echo "SKIPPED: scripts/setup.sh would install" $missing; exit 77; }
source "$ROOT/tests/scripts/lib.sh"
chmod 755 "$tmp"  # for the run as nobody

# ---- the copy -------------------------------------------------------------------------------
clone="$tmp/ndtrain"
mkdir -p "$clone"
git -C "$ROOT" ls-files -z -c -o --exclude-standard |
  tar -C "$ROOT" --null -T - --ignore-failed-read -cf - 2>/dev/null | tar -C "$clone" -xf -
ln -s "$BUILD" "$clone/build"
# what scripts/setup.sh fetched (the cuDNN frontend headers of a CUDA build), not fetched again
[[ -d "$ROOT/third_party" ]] && ln -s "$ROOT/third_party" "$clone/third_party"
for f in "$clone"/configs/*.ini "$clone"/configs/*/*.ini; do
  awk '/^\[/ { sec = $1 }
       sec == "[train]" && /^steps *=/ { $0 = "steps = 3" }
       sec == "[train]" && /^eval_steps *=/ { $0 = "eval_steps = 2" }
       sec == "[sample]" && /^length *=/ { $0 = "length = 16" }
       { print }' "$f" >"$f.cut" && mv "$f.cut" "$f"
done
(cd "$clone" && find . -path ./build -prune -o -print | sort) >"$tmp/before.txt"

# ---- the marked blocks ------------------------------------------------------------------------
awk -v dir="$tmp" '
  /^<!-- readme-check -->$/ { want = 1; next }
  want && /^```/ { if (inside) { inside = 0; want = 0; close(f) } else { inside = 1; n++; f = sprintf("%s/block%d.sh", dir, n) } next }
  inside { print > f }
' "$ROOT/README.md"
blocks=("$tmp"/block*.sh)
check "the README marks blocks to run" test -f "${blocks[0]}"
# cmake is a no-op here (scripts/setup.sh, which scripts/train_fortunes.sh runs, configures and
# builds): the build is BUILD_DIR's, made before the tests, and building it again from inside
# a test would race the tests running beside it. NDT_CUDA is the build's own, so that setup
# fetches nothing for a backend the build does not have.
mkdir -p "$tmp/shim"
printf '#!/bin/sh\necho "(test_readme: cmake $* skipped: %s is configured and built)"\n' "$BUILD" >"$tmp/shim/cmake"
chmod 755 "$tmp/shim" "$tmp/shim/cmake"
build_cuda="$(sed -n 's/^NDT_CUDA:STRING=//p' "$BUILD/CMakeCache.txt" 2>/dev/null)"
# a new user's environment: none of the Open MPI settings the test harness or a shell may have
clean_env=(env -u OMPI_ALLOW_RUN_AS_ROOT -u OMPI_ALLOW_RUN_AS_ROOT_CONFIRM
  -u OMPI_MCA_btl_vader_single_copy_mechanism -u NDT_BUILD_DIR -u NDT_CMAKE_ARGS -u NDT_BUILD_TYPE
  NDT_CUDA="${build_cuda:-AUTO}" PATH="$tmp/shim:$PATH")
run_block() {  # run_block FILE LOG [COMMAND PREFIX...]
  local file="$1" log="$2"
  shift 2
  (cd "$clone" && "$@" "${clean_env[@]}" bash -e -x "$file") >"$log" 2>&1
}
# the quick start's main job first (cut to 1 step): its checkpoint must survive the examples
if (cd "$clone" && "${clean_env[@]}" bash -e scripts/train_fortunes.sh --train.steps 1) >"$tmp/main.log" 2>&1; then
  echo "ok: the main job (scripts/train_fortunes.sh --train.steps 1) ran"
else
  tail -30 "$tmp/main.log" | sed 's/^/   | /'
  echo "FAILED: the main job (scripts/train_fortunes.sh --train.steps 1)"
  status=1
fi
# out/'s files with their size and time: a block may add run folders of its own, never touch
# another's (a file there changed or gone, or a new file in a folder that held a run before)
out_state() { (cd "$clone" && find out -type f -printf '%p %s %T@\n' 2>/dev/null | sort); }
runs_before() { (cd "$clone" && find out \( -name metrics.jsonl -o -name ckpt \) -printf '%h\n' 2>/dev/null | sort -u); }
into_others() {  # into_others BEFORE AFTER RUNS: the paths a block wrote into another's outputs
  local changed added
  changed="$(comm -23 "$1" "$2" | cut -d' ' -f1)"
  added="$(comm -13 <(cut -d' ' -f1 "$1") <(cut -d' ' -f1 "$2"))"
  { echo "$changed"; while read -r f; do
      [[ -n "$f" ]] && while read -r r; do [[ -n "$r" && "$f" == "$r"/* ]] && echo "$f"; done <"$3"
    done <<<"$added"; } | grep -v '^$' | sort -u
}
for b in "${blocks[@]}"; do
  name="$(basename "$b" .sh)"
  echo "== $name:"
  sed 's/^/   /' "$b"
  t0=$SECONDS
  out_state >"$tmp/$name.out_before"
  runs_before >"$tmp/$name.runs_before"
  if run_block "$b" "$tmp/$name.log"; then
    echo "ok: $name ran ($((SECONDS - t0)) s; $(grep -c '^step ' "$tmp/$name.log") step lines, the last: $(grep '^step ' "$tmp/$name.log" | tail -1 | cut -c1-40))"
  else
    tail -40 "$tmp/$name.log" | sed 's/^/   | /'
    echo "FAILED: $name (its log above)"
    status=1
  fi
  out_state >"$tmp/$name.out_after"
  others="$(into_others "$tmp/$name.out_before" "$tmp/$name.out_after" "$tmp/$name.runs_before")"
  [[ -z "$others" ]] || echo "$others" | head -10 | sed "s/^/   $name wrote into an earlier run's outputs: /"
  check "$name wrote only into run folders of its own" test -z "$others"
done

# ---- what they wrote ----------------------------------------------------------------------------
(cd "$clone" && find . -path ./build -prune -o -print | sort) >"$tmp/after.txt"
outside="$(comm -13 "$tmp/before.txt" "$tmp/after.txt" | grep -v '^\./out\(/\|$\)\|^\./data\(/\|$\)')"
[[ -z "$outside" ]] || echo "$outside" | head -20 | sed 's/^/   written outside out\/ and data\/: /'
check "the commands wrote nothing outside out/ and data/" test -z "$outside"
if [[ -f "$clone/out/fortunes/ckpt/latest" ]]; then
  latest="$(cat "$clone/out/fortunes/ckpt/latest")"
  (cd "$clone" && "${clean_env[@]}" bash -e -x scripts/train_fortunes.sh --train.steps 2 --checkpoint.resume true) \
    >"$tmp/resume.log" 2>&1
  rc=$?
  ((rc == 0)) || tail -20 "$tmp/resume.log" | sed 's/^/   | /'
  check "the main job resumes its own checkpoint after the examples" test "$rc" -eq 0
  check "and went on from it" grep -q "$latest" "$tmp/resume.log"
else
  check "the main job wrote its checkpoint (out/fortunes/ckpt/latest)" false
fi

# ---- the last block again, as an ordinary user --------------------------------------------------
if [[ $EUID -eq 0 ]] && command -v setpriv >/dev/null && ((${#blocks[@]})); then
  rm -rf "$clone/out/parallel"  # its checkpoints are root's run's; nobody's run writes them anew
  chmod -R a+rwX "$clone"
  last="${blocks[-1]}"
  chmod a+r "$last"
  nobody=(setpriv --reuid=65534 --regid=65534 --clear-groups env HOME="$clone")
  if ! "${nobody[@]}" test -x "$BUILD/train_gpt" -a -r "$last" -a -w "$clone"; then
    echo "note: not run as nobody: a folder on the way to $BUILD/train_gpt or to $tmp is closed to others"
  elif run_block "$last" "$tmp/as_nobody.log" "${nobody[@]}"; then
    echo "ok: $(basename "$last" .sh) ran as nobody too"
  else
    tail -30 "$tmp/as_nobody.log" | sed 's/^/   | /'
    echo "FAILED: $(basename "$last" .sh) as nobody (its log above)"
    status=1
  fi
fi
exit $status
