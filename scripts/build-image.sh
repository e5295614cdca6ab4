#!/usr/bin/env bash
# Build the fs3 container image with podman from deploy/Dockerfile, without any registry.
#
#   bash scripts/build-image.sh          # fs3:local  (target fs3: SQLite KV), for deploy/compose.local.yml
#   bash scripts/build-image.sh --fdb    # fs3:latest (target fs3-fdb: + libfdb_c; needs the
#                                        #  foundationdb/foundationdb image, so a registry)
#
# The base image is $FS3_BASE_IMAGE when set (e.g. python:3.11-slim-bookworm where a
# registry is reachable), else localhost/fs3-base:bookworm, which this script makes
# when podman does not have it: `debootstrap --variant=minbase bookworm` into a
# temporary directory, imported with `podman import`.
#
# Both images stay in podman's storage between runs. The built image carries the
# label fs3.source: a hash of everything it is built from (the files .dockerignore
# lets into the build context, the target and the base image's id); when the image
# exists with the same hash nothing is rebuilt. When it changed, podman rebuilds
# from its layer cache (a source change reinstalls only fs3 itself: the dependency
# stage is kept as localhost/fs3-deps:cache) and the superseded layers are pruned.
#
# podman reads $CONTAINERS_CONF; on a machine that forbids containers to set
# rlimits, point it at a containers.conf holding `[containers] default_ulimits = []`.
# Prints the image name on the last line of stdout.
set -euo pipefail
cd "$(dirname "$0")/.."

target=fs3
image=localhost/fs3:local
case "${1:-}" in
  "") ;;
  --fdb) target=fs3-fdb; image=localhost/fs3:latest ;;
  -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "build-image.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
esac

for tool in podman sha256sum; do
  command -v "$tool" >/dev/null || { echo "build-image.sh: $tool is not installed (bash scripts/install.sh installs it)" >&2; exit 1; }
done

# One build at a time on this machine (a second run waits, then finds the image current).
exec 9>"${TMPDIR:-/tmp}/fs3-build-image.lock"
flock 9

say() { echo "build-image: $*" >&2; }

base=${FS3_BASE_IMAGE:-localhost/fs3-base:bookworm}
if ! podman image exists "$base"; then
  if [ -n "${FS3_BASE_IMAGE:-}" ]; then
    say "pulling $base"
    podman pull "$base" >&2
  else
    command -v debootstrap >/dev/null || { echo "build-image.sh: debootstrap is not installed" >&2; exit 1; }
    say "no $base: debootstrap --variant=minbase bookworm (once; podman keeps it)"
    root=$(mktemp -d "${TMPDIR:-/tmp}/fs3-rootfs.XXXXXX")
    trap 'rm -rf "$root"' EXIT
    t0=$SECONDS
    debootstrap --variant=minbase bookworm "$root" "${FS3_DEBIAN_MIRROR:-http://deb.debian.org/debian}" >&2
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar -C "$root" -c . | podman import \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'ENV LANG=C.UTF-8' \
      --change 'CMD ["/bin/bash"]' \
      - "$base" >&2
    rm -rf "$root"
    trap - EXIT
    say "base image $base made in $((SECONDS - t0)) s"
  fi
fi

# What the image is built from: the files of the build context (.dockerignore keeps
# only these), the target and the base.
hash=$(
  {
    find pyproject.toml fs3 deploy/Dockerfile deploy/*.toml deploy/compose.cluster \
      -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 \
      | LC_ALL=C sort -z | xargs -0 sha256sum
    echo "target=$target base=$(podman image inspect --format '{{.Id}}' "$base")"
  } | sha256sum | cut -c1-20
)

old=""
if podman image exists "$image"; then
  old=$(podman image inspect --format '{{.Id}}' "$image")
  if [ "$(podman image inspect --format '{{index .Labels "fs3.source"}}' "$image")" = "$hash" ]; then
    say "$image is up to date (fs3.source=$hash)"
    echo "$image"
    exit 0
  fi
fi

# HTTPS to the package index may pass a proxy with its own CA: lend pip the host's bundle.
ca_args=()
for ca in "${PIP_CERT:-}" /etc/ssl/certs/ca-certificates.crt; do
  if [ -n "$ca" ] && [ -f "$ca" ]; then
    ca_args=(--volume "$(readlink -f "$ca"):/etc/ssl/fs3-pip-ca.crt:ro" --build-arg PIP_CA_BUNDLE=/etc/ssl/fs3-pip-ca.crt)
    break
  fi
done

say "building $image (target $target, base $base)"
t0=$SECONDS
build=(podman build --network host -f deploy/Dockerfile --build-arg BASE_IMAGE="$base" "${ca_args[@]}")
# The dependency stage gets a name of its own: its layers stay cached (not dangling) when
# the pruning below removes the superseded layers of earlier builds.
"${build[@]}" --target deps -t localhost/fs3-deps:cache . >&2
"${build[@]}" --target "$target" --label fs3.source="$hash" -t "$image" . >&2
new=$(podman image inspect --format '{{.Id}}' "$image")
if [ -n "$old" ] && [ "$old" != "$new" ]; then
  podman rmi "$old" >/dev/null 2>&1 || say "kept the previous image $old (still in use)"
fi
podman image prune -f --filter label=fs3.image=fs3 >/dev/null
say "built $image in $((SECONDS - t0)) s (fs3.source=$hash)"
echo "$image"
