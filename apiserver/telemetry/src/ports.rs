//! Loopback ports for processes that must be told their address before they listen
//! (etcd, kube-apiserver, an agent that advertises it).
//!
//! A port from binding `:0` comes from the kernel's ephemeral range, where every outgoing
//! connection also takes its source port: between our releasing it and the child binding
//! it, any connection on the machine (kube-apiserver's to its etcd, a test's to its
//! server) may take it, and the child fails with "address already in use". These ports
//! come from below that range, where no connection takes a source port; each is handed
//! out once per test process, starting at a random place so that two processes seldom
//! meet, and checked free before it is handed out.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::sync::Mutex;

/// The lowest port handed out: above the well-known and most registered services'.
const LOWEST: u16 = 20_000;
/// Where Linux's ephemeral range starts when `/proc` does not say.
const EPHEMERAL_DEFAULT: u16 = 32_768;

/// A loopback address free a moment ago and outside the ephemeral range, for a process
/// that must know its address before it listens.
pub fn free_loopback_address() -> SocketAddr {
    static NEXT: Mutex<Option<u16>> = Mutex::new(None);
    let end = ephemeral_start();
    let span = end - LOWEST;
    let mut next = NEXT.lock().unwrap_or_else(|e| e.into_inner());
    let mut port = next.unwrap_or_else(|| {
        // std's hasher keys are random per process: a random start without a dependency.
        let random = std::hash::BuildHasher::hash_one(&std::hash::RandomState::new(), 0u8);
        LOWEST + u16::try_from(random % u64::from(span)).expect("below span")
    });
    for _ in 0..span {
        let candidate = port;
        port = if port + 1 >= end { LOWEST } else { port + 1 };
        if TcpListener::bind((Ipv4Addr::LOCALHOST, candidate)).is_ok() {
            *next = Some(port);
            return SocketAddr::from((Ipv4Addr::LOCALHOST, candidate));
        }
    }
    panic!("no free loopback port in {LOWEST}..{end}")
}

/// The first port of the kernel's ephemeral range (`net.ipv4.ip_local_port_range`).
fn ephemeral_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .filter(|start| *start > LOWEST + 1_000)
        .unwrap_or(EPHEMERAL_DEFAULT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_free_and_below_the_ephemeral_range() {
        let ports: Vec<u16> = (0..50).map(|_| free_loopback_address().port()).collect();
        let distinct: std::collections::BTreeSet<_> = ports.iter().collect();
        assert_eq!(distinct.len(), ports.len(), "{ports:?}");
        assert!(
            ports
                .iter()
                .all(|p| (LOWEST..ephemeral_start()).contains(p)),
            "{ports:?}"
        );
        let port = free_loopback_address().port();
        TcpListener::bind((Ipv4Addr::LOCALHOST, port)).expect("the port is free");
    }
}
