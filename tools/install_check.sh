#!/usr/bin/env bash
# Real-install check of tmpatch's auto-apply (issue 4): build a wheel, install it
# into a fresh venv (non-editable) and the source tree into another one as a PEP 660
# editable install; in each check that
#   - tmpatch.pth lands in site-packages (the same line as tmpatch/bootstrap/tmpatch.pth)
#   - the console script answers (tmpatch --help, tmpatch status)
#   - TMPATCH=1 python -c ... patches torchmetrics lazily (no torch at start-up)
#   - a multiprocessing "spawn" child is patched
#   - a two-rank python -m torch.distributed.run job on gloo is patched on each rank
#   - tmpatch run keeps an existing user sitecustomize, and bootstraps once
#   - an error in the bootstrap is one line on stderr and the program runs on
#   - without the variable (or TMPATCH=0) nothing is patched, tmpatch is not even imported
#
#   PYTHON=/path/to/python bash tools/install_check.sh     # default: python
#
# $PYTHON must have torch (the venvs see its site-packages through a .pth, so torch is
# not installed again); torchmetrics $TM_RELEASE (default 1.4.0, where safe_divide
# applies) is installed with --no-deps into each venv. Each step is bounded by
# $STEP_TIMEOUT seconds (default 300). Prints PASS/FAIL per check; exits 1 on any
# failure. KEEP=1 keeps the work directory ($WORK, default a new temp dir).
set -uo pipefail

PYTHON=${PYTHON:-python}
TM_RELEASE=${TM_RELEASE:-1.4.0}
STEP_TIMEOUT=${STEP_TIMEOUT:-300}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/tmpatch-install-check.XXXXXX")}
mkdir -p "$WORK"
FAILED=0
PASSED=0
unset PYTHONPATH $(env | grep -o "^TMPATCH[A-Z_]*" || true)  # every TMPATCH_* variable, whatever the settings registry adds

cleanup() { if [ "${KEEP:-0}" = 1 ]; then echo "work directory kept: $WORK"; else rm -rf "$WORK"; fi; }
trap cleanup EXIT

# check NAME CMD...: run CMD (bounded), print PASS/FAIL, show its output on failure
check() {
  local name=$1; shift
  local log="$WORK/last.log"
  if (cd "$WORK" && timeout "$STEP_TIMEOUT" "$@") >"$log" 2>&1; then
    echo "PASS  $name"; PASSED=$((PASSED + 1))
  else
    echo "FAIL  $name (exit $?)"; sed 's/^/      /' "$log" | tail -40; FAILED=$((FAILED + 1))
  fi
}
step() {  # like check, but a failed set-up step ends the run
  local before=$FAILED
  check "$@"
  if [ "$FAILED" -gt "$before" ]; then echo "install check: set-up failed"; exit 1; fi
}

echo "install check: PYTHON=$PYTHON ($("$PYTHON" -c 'import sys; print(sys.version.split()[0])')), torchmetrics $TM_RELEASE, work dir $WORK"

# -- build ------------------------------------------------------------------------
# a clean copy of the tree (tracked and untracked files, no build leftovers), so that
# nothing is built inside the repository
SRC="$WORK/src"
step "copy the source tree" bash -c "mkdir -p '$SRC' && tar -C '$ROOT' --exclude=./.git --exclude=./.venv --exclude=./.venvs --exclude='./.venvs-*' \
  --exclude=./.matrix --exclude=./build --exclude=./dist --exclude='*.egg-info' --exclude=__pycache__ \
  --exclude=.hypothesis -cf - . | tar -C '$SRC' -xf -"
# build with the base's setuptools when it has a PEP 660 one (>= 64), else let pip
# fetch setuptools into an isolated build environment
if "$PYTHON" -c 'import setuptools, sys; sys.exit(int(setuptools.__version__.split(".")[0]) < 64)' 2>/dev/null; then
  ISOLATION=--no-build-isolation
else
  ISOLATION=
fi
# PEP 660 for the editable install (older pips fall back to "setup.py develop" without
# a pyproject.toml unless told; newer ones know nothing else)
PEP517=
if "$PYTHON" -m pip install --help 2>/dev/null | grep -q -- --use-pep517; then PEP517=--use-pep517; fi
step "build the wheel (pip wheel --no-deps $ISOLATION $PEP517)" \
  "$PYTHON" -m pip wheel --quiet --disable-pip-version-check --no-deps $ISOLATION $PEP517 -w "$WORK/dist" "$SRC"
WHEEL=$(ls "$WORK"/dist/tmpatch-*.whl 2>/dev/null | head -n 1)
step "the wheel has tmpatch.pth at its root" "$PYTHON" -c "
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
assert 'tmpatch.pth' in names, names
print(zipfile.ZipFile(sys.argv[1]).read('tmpatch.pth').decode())" "$WHEEL"

# the base interpreter's site-packages, seen by the new venvs through a plain path
# .pth (.pth files in those directories are not processed: the base's own tmpatch.pth
# or editable finder, if any, stay out)
"$PYTHON" -c '
import sys
print("\n".join(p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages"))))
' >"$WORK/base-site.txt"

# -- probes (run inside the venvs) ---------------------------------------------------
cat >"$WORK/probe.py" <<'EOF'
"""python probe.py patched|unpatched|spawn|rank|sitecustomize"""
import json, os, sys

LOADED_AT_START = sorted(m for m in ("tmpatch", "torch", "torchmetrics") if m in sys.modules)


def patched(where):
    import torchmetrics
    import tmpatch
    from torchmetrics.utilities import compute
    f_beta = sys.modules["torchmetrics.functional.classification.f_beta"]
    states = tmpatch.status().states()
    print(f"{where}: pid {os.getpid()} torchmetrics {torchmetrics.__version__} {json.dumps(states)}")
    assert states["safe_divide"] == "applied", states
    assert tmpatch.is_patched(compute._safe_divide), "compute._safe_divide is not tmpatch's"
    assert f_beta._safe_divide is compute._safe_divide, "a module that bound _safe_divide kept the original"
    return True


def main(mode):
    if mode == "patched":
        assert "torch" not in LOADED_AT_START and "torchmetrics" not in LOADED_AT_START, LOADED_AT_START
        import tmpatch.bootstrap as boot
        assert (boot.started, boot.state) == ("pth", "armed"), (boot.started, boot.state)
        patched("main")
    elif mode == "unpatched":
        assert LOADED_AT_START == [], LOADED_AT_START  # the .pth line imported nothing
        import torchmetrics, tmpatch
        from torchmetrics.utilities import compute
        states = tmpatch.status().states()
        print(json.dumps(states))
        assert set(states.values()) == {"off"}, states
        assert not tmpatch.is_patched(compute._safe_divide)
    elif mode == "spawn":
        import multiprocessing as mp
        with mp.get_context("spawn").Pool(1) as pool:
            assert pool.apply(patched, ("spawn child",)) is True
    elif mode == "rank":
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        ok = torch.tensor([1.0 if patched(f"rank {dist.get_rank()}") else 0.0])
        dist.all_reduce(ok)
        assert dist.get_world_size() == 2 and ok.item() == 2.0, ok
        dist.destroy_process_group()
    elif mode == "sitecustomize":
        import tmpatch.bootstrap as boot
        here = os.path.realpath(boot.DIRECTORY)
        assert os.environ["PYTHONPATH"].split(os.pathsep)[0] == boot.DIRECTORY
        assert all(os.path.realpath(p) != here for p in sys.path if p), "bootstrap dir left on sys.path"
        assert getattr(sys.modules["sitecustomize"], "USER_SITECUSTOMIZE", False), sys.modules["sitecustomize"]
        assert os.path.exists(os.environ["USER_MARKER"]), "the user's sitecustomize did not run"
        assert sum(isinstance(f, boot.Trigger) for f in sys.meta_path) == 1, sys.meta_path
        assert boot.started == "pth", boot.started  # the .pth came first; sitecustomize did not redo it
        patched("tmpatch run")
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(f"{mode}: ok")


if __name__ == "__main__":
    main(sys.argv[1])
EOF
mkdir -p "$WORK/usersite" "$WORK/broken/tmpatch"
cat >"$WORK/usersite/sitecustomize.py" <<'EOF'
import os
USER_SITECUSTOMIZE = True
open(os.environ["USER_MARKER"], "w").close()
EOF
echo "raise RuntimeError('tmpatch is broken here')" >"$WORK/broken/tmpatch/__init__.py"

free_port() { "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# -- one venv per kind of install --------------------------------------------------
for KIND in wheel editable; do
  VENV="$WORK/venv-$KIND"
  PY="$VENV/bin/python"
  echo "-- $KIND install ($VENV)"
  step "[$KIND] create the venv" "$PYTHON" -m venv --without-pip "$VENV"
  SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  cp "$WORK/base-site.txt" "$SITE/_tmpatch_check_base.pth"
  if [ "$KIND" = wheel ]; then
    step "[$KIND] pip install the wheel" "$PY" -m pip install --quiet --disable-pip-version-check --no-deps "$WHEEL"
  else
    step "[$KIND] pip install -e (PEP 660)" "$PY" -m pip install --quiet --disable-pip-version-check --no-deps \
      $ISOLATION $PEP517 -e "$SRC"
  fi
  step "[$KIND] pip install torchmetrics==$TM_RELEASE --no-deps" "$PY" -m pip install --quiet \
    --disable-pip-version-check --no-deps "torchmetrics==$TM_RELEASE"
  for dep in lightning_utilities:lightning-utilities wrapt:wrapt packaging:packaging; do
    "$PY" -c "import ${dep%%:*}" 2>/dev/null || step "[$KIND] pip install ${dep#*:}" "$PY" -m pip install \
      --quiet --disable-pip-version-check "${dep#*:}"
  done

  check "[$KIND] tmpatch.pth is in site-packages, the line of the source" \
    cmp "$SITE/tmpatch.pth" "$ROOT/tmpatch/bootstrap/tmpatch.pth"
  if [ "$KIND" = editable ]; then
    check "[$KIND] tmpatch is imported from the source tree" "$PY" -c "
import os, sys, tmpatch
assert os.path.dirname(os.path.dirname(tmpatch.__file__)) == sys.argv[1], tmpatch.__file__" "$SRC"
  fi
  check "[$KIND] console script: tmpatch --help" "$VENV/bin/tmpatch" --help
  check "[$KIND] console script: tmpatch status" bash -c "'$VENV/bin/tmpatch' status --json | '$PY' -c '
import json, sys; rows = {r[\"name\"]: r[\"state\"] for r in json.load(sys.stdin)}; print(rows)
assert rows[\"safe_divide\"] == \"applied\", rows'"
  check "[$KIND] TMPATCH=1 python -c: lazy, then patched" env TMPATCH=1 "$PY" "$WORK/probe.py" patched
  check "[$KIND] TMPATCH=1: a multiprocessing spawn child is patched" env TMPATCH=1 "$PY" "$WORK/probe.py" spawn
  check "[$KIND] TMPATCH=1: torch.distributed.run, 2 ranks on gloo, each patched" env TMPATCH=1 \
    "$PY" -m torch.distributed.run --nnodes=1 --nproc_per_node=2 --master_addr=127.0.0.1 \
    --master_port="$(free_port)" "$WORK/probe.py" rank
  rm -f "$WORK/user-marker"
  check "[$KIND] tmpatch run: the user's sitecustomize runs, one bootstrap, patched" \
    env PYTHONPATH="$WORK/usersite" USER_MARKER="$WORK/user-marker" \
    "$VENV/bin/tmpatch" run -- "$PY" "$WORK/probe.py" sitecustomize
  check "[$KIND] tmpatch run propagates the exit status" bash -c \
    "'$VENV/bin/tmpatch' run -- '$PY' -c 'raise SystemExit(7)'; test \$? = 7"
  check "[$KIND] a broken tmpatch: one line on stderr, the program runs on" bash -c "
    out=\$(cd '$WORK' && TMPATCH=1 PYTHONPATH='$WORK/broken' '$PY' -c 'print(\"ran on\")' 2>'$WORK/err.txt')
    cat '$WORK/err.txt'; test \"\$out\" = 'ran on' && test \$(wc -l <'$WORK/err.txt') -eq 1 \
      && grep -q '^tmpatch: .*broken here.*runs on unpatched' '$WORK/err.txt'"
  check "[$KIND] without the variable nothing is patched" env -u TMPATCH "$PY" "$WORK/probe.py" unpatched
  check "[$KIND] TMPATCH=0: nothing is patched" env TMPATCH=0 "$PY" "$WORK/probe.py" unpatched
done

echo "install check: $PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
