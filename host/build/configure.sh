#!/usr/bin/env bash
# Installs the Host image's packages and sets up what the files in rootfs/ need: run
# once in the Containerfile's image stage, as root, with versions.env at
# /usr/share/battery/versions.env.
set -euo pipefail

kubernetes=$(sed -n 's/^KUBERNETES_VERSION=//p' /usr/share/battery/versions.env)
[[ -n $kubernetes ]] || { echo "configure.sh: versions.env names no KUBERNETES_VERSION" >&2; exit 65; }

# From the base image's signed Fedora repositories and the pinned Kubernetes one.
# systemd-networkd makes the guest bridge; dnsmasq serves it DHCP and DNS.
dnf -y install --setopt=install_weak_deps=False \
    "kubelet-$kubernetes" "kubeadm-$kubernetes" cri-tools \
    cloud-init dnsmasq nftables systemd-networkd lvm2 device-mapper-persistent-data \
    iproute conntrack-tools ethtool socat container-selinux
dnf clean all
rm -rf /var/cache/dnf /var/lib/dnf

# dnsmasq runs only as battery-dnsmasq, on the bridge, never as the distribution's
# unit on every interface. networkd manages the bridge alone (its .network matches
# only virbr-battery), so NetworkManager keeps the primary interface.
systemctl disable dnsmasq.service
systemctl enable systemd-networkd.service containerd.service kubelet.service \
    battery-network.service battery-dnsmasq.service battery-thin-pool.service \
    battery-kvm.service flintlockd.path battery-flintlockd-restart.path
# A Host changes image only when its pool is rolled (deploy/capi), never by itself.
systemctl mask bootc-fetch-apply-updates.timer

# What the kubelet, kubeadm and CNI plugins write under /usr and /opt goes to /var:
# on a bootc Host /usr is read-only, and /opt and /usr/local are the base's links
# into /var. /usr/libexec/kubernetes holds the kubelet's volume plugins.
for link in /opt:var/opt /usr/local:../var/usrlocal; do
    path=${link%%:*} target=${link#*:}
    [[ -L $path ]] || { echo "configure.sh: $path is not a link into /var in the base image" >&2; exit 1; }
    [[ $(readlink "$path") == "$target" ]] || { echo "configure.sh: $path links to $(readlink "$path"), not $target" >&2; exit 1; }
done
rm -rf /usr/libexec/kubernetes
ln -s ../../var/lib/kubernetes-libexec /usr/libexec/kubernetes

# SELinux stays enforcing (the base's default); containerd's CRI labels each pod.
grep -qx 'SELINUX=enforcing' /etc/selinux/config || { echo "configure.sh: SELinux is not enforcing in the base" >&2; exit 1; }
