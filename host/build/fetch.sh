#!/usr/bin/env bash
# Downloads and verifies every binary of the Host image that no signed package
# repository provides, for one architecture, into /out (laid out as the image's /).
#
#   fetch.sh VERSIONS_FILE ARCH      (ARCH: amd64 or arm64, the build's TARGETARCH)
#
# A download without a checksum in VERSIONS_FILE is refused, never fetched unchecked.
set -euo pipefail

versions=$1 arch=$2
case $arch in
    amd64) uname_arch=x86_64 ;;
    arm64) uname_arch=aarch64 ;;
    *) echo "fetch.sh: no Host image for architecture $arch (amd64 or arm64)" >&2; exit 64 ;;
esac
ARCH_UPPER=${arch^^}

declare -A v
while IFS= read -r line || [[ -n $line ]]; do
    [[ $line =~ ^[[:space:]]*(#|$) ]] && continue
    [[ $line =~ ^([A-Z0-9_]+)=([A-Za-z0-9._-]*)$ ]] || { echo "fetch.sh: $versions: bad line: $line" >&2; exit 65; }
    v[${BASH_REMATCH[1]}]=${BASH_REMATCH[2]}
done <"$versions"

need() { # KEY: its value, or stop the build
    [[ -n ${v[$1]:-} ]] || { echo "fetch.sh: $versions has no $1; refusing to download without it" >&2; exit 65; }
    printf '%s' "${v[$1]}"
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# get NAME URL SHA256: downloads to $work/NAME and checks it.
get() {
    [[ $3 =~ ^[0-9a-f]{64}$ ]] || { echo "fetch.sh: the sha256 for $2 is not 64 hex digits; refusing" >&2; exit 65; }
    curl --fail --silent --show-error --location --retry 3 --proto '=https' -o "$work/$1" "$2"
    echo "$3  $work/$1" | sha256sum --check --strict --quiet
    echo "fetch.sh: $1 verified ($3)"
}

mkdir -p /out/usr/bin /out/etc/pki/rpm-gpg

version=$(need CONTAINERD_VERSION)
get containerd.tgz "https://github.com/containerd/containerd/releases/download/v$version/containerd-$version-linux-$arch.tar.gz" \
    "$(need "CONTAINERD_SHA256_$ARCH_UPPER")"
tar -xzf "$work/containerd.tgz" -C /out/usr bin/

version=$(need RUNC_VERSION)
get runc "https://github.com/opencontainers/runc/releases/download/v$version/runc.$arch" "$(need "RUNC_SHA256_$ARCH_UPPER")"
install -m 0755 "$work/runc" /out/usr/bin/runc

version=$(need FIRECRACKER_VERSION)
get firecracker.tgz "https://github.com/firecracker-microvm/firecracker/releases/download/v$version/firecracker-v$version-$uname_arch.tgz" \
    "$(need "FIRECRACKER_SHA256_$ARCH_UPPER")"
tar -xzf "$work/firecracker.tgz" -C "$work"
for binary in firecracker jailer; do
    install -m 0755 "$work/release-v$version-$uname_arch/$binary-v$version-$uname_arch" "/out/usr/bin/$binary"
done

version=$(need FLINTLOCK_VERSION)
get flintlockd "https://github.com/liquidmetal-dev/flintlock/releases/download/v$version/flintlockd_$arch" \
    "$(need "FLINTLOCK_SHA256_$ARCH_UPPER")"
install -m 0755 "$work/flintlockd" /out/usr/bin/flintlockd

minor=$(need KUBERNETES_MINOR)
get kubernetes.key "https://pkgs.k8s.io/core:/stable:/v$minor/rpm/repodata/repomd.xml.key" "$(need KUBERNETES_REPO_KEY_SHA256)"
install -m 0644 "$work/kubernetes.key" /out/etc/pki/rpm-gpg/kubernetes.key
mkdir -p /out/etc/yum.repos.d
cat >/out/etc/yum.repos.d/kubernetes.repo <<REPO
[kubernetes]
name=Kubernetes v$minor
baseurl=https://pkgs.k8s.io/core:/stable:/v$minor/rpm/
enabled=1
gpgcheck=1
repo_gpgcheck=1
gpgkey=file:///etc/pki/rpm-gpg/kubernetes.key
REPO
