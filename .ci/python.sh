#!/usr/bin/env bash
# Finds a CPython of at least MIN (default 3.12; JAX 0.11 dropped Python 3.11) that can make
# venvs, and prints its path on stdout (the last line). Everything else goes to stderr.
#
#   PY313=$(bash .ci/python.sh 3.12)     # .ci/run's newest-Python side
#
# Where it looks, newest first (3.13, then 3.12; JAX 0.12 ships wheels for both):
#   1. pythonX.Y on PATH, run to see that it is one (a pyenv shim of a version that is not
#      selected is on PATH but fails: it is skipped);
#   2. pyenv's installed versions, $(pyenv root)/versions/X.Y*/bin/python3 (pyenv root: the
#      `pyenv` command's, else $PYENV_ROOT, else ~/.pyenv): CI's machine image builds 3.12
#      and 3.13 there;
#   3. a Debian trixie root holding Debian's python3.13, built once per machine with
#      debootstrap from the Debian mirror apt already uses, cached in $AOT_CI_CACHE
#      (default /var/cache/jax-aot-ci) and reused by later runs. It prints a wrapper
#      that runs the root's python3.13 under chroot, in the caller's directory and
#      environment, with the checkout, /tmp, /var/tmp and pip's settings visible at the
#      same paths (AOT_CI_FORCE_ROOT=1 skips 1 and 2, to test this route).
set -euo pipefail

MIN=${1:-3.12}
CACHE=${AOT_CI_CACHE:-/var/cache/jax-aot-ci}
log() { echo "[python.sh] $*" >&2; }

# Whether $1 is a CPython >= MIN with venv and ensurepip (Debian splits them off).
usable() {
    "$1" - "$MIN" >/dev/null 2>&1 <<'PY'
import sys, venv, ensurepip  # noqa: F401
want = tuple(int(p) for p in sys.argv[1].split("."))
sys.exit(0 if sys.version_info[:2] >= want else 1)
PY
}

candidates=()
for v in 3.13 3.12; do
    # Only versions >= MIN.
    [ "$(printf '%s\n%s\n' "$MIN" "$v" | sort -V | head -n 1)" = "$MIN" ] || continue
    candidates+=("$v")
done

if [ "${AOT_CI_FORCE_ROOT:-0}" != 1 ]; then
    pyenv_root=$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")
    for v in "${candidates[@]}"; do
        found=$(command -v "python$v" 2>/dev/null || true)
        if [ -n "$found" ] && usable "$found"; then
            # A shim re-resolves on every call; print the interpreter it runs.
            real=$("$found" -c 'import sys; print(sys.executable)')
            log "python $v: $real (PATH)"; echo "$real"; exit 0
        fi
        for dir in $(ls -d "$pyenv_root"/versions/"$v"* 2>/dev/null | sort -rV); do
            if [ -x "$dir/bin/python3" ] && usable "$dir/bin/python3"; then
                log "python $v: $dir/bin/python3 (pyenv)"; echo "$dir/bin/python3"; exit 0
            fi
        done
    done
fi

# 3. No such Python here: Debian's, in a trixie root (bookworm, this image's Debian, ships 3.11).
[ "$(id -u)" -eq 0 ] || { log "no Python >= $MIN found, and building a trixie root needs root"; exit 1; }
ROOT=$CACHE/trixie
WRAPPER=$CACHE/python3.13
if [ ! -x "$ROOT/usr/bin/python3.13" ]; then
    start=$(date +%s)
    command -v debootstrap >/dev/null 2>&1 || {
        log "installing Debian's debootstrap"
        (export DEBIAN_FRONTEND=noninteractive; apt-get update -qq && apt-get install -y -qq debootstrap) >&2
    }
    # The mirror apt is configured with (deb822 .sources files or sources.list lines).
    mirror=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '/^URIs:/ {print $2}' | grep -v security | head -n 1)
    [ -n "$mirror" ] || mirror=$(grep -hE '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
        | awk '{print $2}' | grep -v security | head -n 1)
    [ -n "$mirror" ] || { log "no Debian mirror in /etc/apt/sources.list*"; exit 1; }
    log "building a Debian trixie root with python3.13 in $ROOT from $mirror"
    rm -rf "$ROOT.partial"
    mkdir -p "$CACHE"
    debootstrap --variant=minbase --include=python3.13,python3.13-venv,ca-certificates \
        trixie "$ROOT.partial" "$mirror" >&2
    mv "$ROOT.partial" "$ROOT"
    log "trixie root built in $(( $(date +%s) - start ))s"
fi

# pip inside the root needs this machine's pip settings and certificates, at the same paths.
for f in /etc/pip.conf /etc/xdg/pip "${PIP_CERT:-}" "${REQUESTS_CA_BUNDLE:-}" "${SSL_CERT_FILE:-}" /etc/resolv.conf; do
    [ -n "$f" ] && [ -e "$f" ] || continue
    mkdir -p "$ROOT$(dirname "$f")"
    rm -rf "${ROOT:?}$f"
    cp -a "$f" "$ROOT$f"
done

IN_ROOT=$CACHE/in-root
cat >"$IN_ROOT" <<EOF
#!/usr/bin/env bash
# Runs a command in the Debian trixie root $ROOT (written by .ci/python.sh) under chroot, in
# the caller's directory and environment. The directories below are bind-mounted at their
# own paths, so that venvs, checkouts and pip's cache made in there are the same files
# outside: the checkout, /tmp, /var/tmp, pip's cache, and AOT_CI_ROOT_MOUNTS (.ci/run adds
# the prefix of the other Python, whose venvs the cross-release tests run from in there).
# The mounts live in a mount namespace of this command's own (unshare): none is left
# behind, so removing the cached root never reaches through one into the checkout.
set -euo pipefail
if [ -z "\${AOT_CI_IN_NAMESPACE:-}" ]; then
    AOT_CI_IN_NAMESPACE=1 exec unshare --mount --propagation private "\$0" "\$@"
fi
unset AOT_CI_IN_NAMESPACE
ROOT=$ROOT
for d in /proc /dev /tmp /var/tmp "\${HOME:-/root}/.cache" "\$(git -C "\$PWD" rev-parse --show-toplevel 2>/dev/null || echo "\$PWD")" \${AOT_CI_ROOT_MOUNTS:-}; do
    [ -d "\$d" ] || continue
    mkdir -p "\$ROOT\$d"
    mount --rbind "\$d" "\$ROOT\$d"
done
exec chroot "\$ROOT" /usr/bin/env -C "\$PWD" "\$@"
EOF
chmod +x "$IN_ROOT"
printf '#!/bin/sh\n# python3.13 of the trixie root (.ci/python.sh)\nexec %s /usr/bin/python3.13 "$@"\n' "$IN_ROOT" >"$WRAPPER"
chmod +x "$WRAPPER"
usable "$WRAPPER" || { log "$WRAPPER does not run a usable python3.13"; exit 1; }
log "python 3.13: $WRAPPER (Debian trixie root)"
echo "$WRAPPER"
