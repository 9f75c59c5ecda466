//! [`EventLog`]: an `Events.Subscribe` stream that keeps what it received and checks,
//! on every event, what the reference (§4.6, §8) says always holds.

use std::time::Duration;

use battery_proto::poolmgr::v1alpha1::{Event, EventType, PoolRef};
use tokio::time::{Instant, timeout_at};
use tonic::Streaming;

/// An event's type; panics on a number the API does not define.
#[track_caller]
pub fn event_type(event: &Event) -> EventType {
    EventType::try_from(event.r#type)
        .unwrap_or_else(|_| panic!("event {} has unknown type {}", event.id, event.r#type))
}

/// A subscription and everything it delivered (in this test's namespaces).
pub struct EventLog {
    stream: Streaming<Event>,
    /// Subscribed to one pool: every event must be that pool's.
    pool: Option<PoolRef>,
    /// Events of pools outside namespaces starting with this are not kept.
    namespace: String,
    history: Vec<Event>,
    last_id: i64,
    timeout: Duration,
}

impl EventLog {
    pub(crate) fn new(
        stream: Streaming<Event>,
        pool: Option<PoolRef>,
        namespace: &str,
        timeout: Duration,
    ) -> Self {
        Self {
            stream,
            pool,
            namespace: namespace.to_owned(),
            history: Vec::new(),
            last_id: 0,
            timeout,
        }
    }

    /// The events kept so far, in the order (ascending id) they arrived.
    pub fn history(&self) -> &[Event] {
        &self.history
    }

    /// The highest id received (of any pool).
    pub fn last_id(&self) -> i64 {
        self.last_id
    }

    fn accept(&mut self, event: Event) {
        assert!(
            event.id > self.last_id,
            "event ids must strictly increase on a stream: got {} after {} ({event:?})",
            event.id,
            self.last_id
        );
        self.last_id = event.id;
        let kind = event_type(&event);
        assert!(
            !matches!(
                kind,
                EventType::Unspecified
                    | EventType::VmReleased
                    | EventType::PoolReplenishing
                    | EventType::PoolSizeBelowTarget
            ),
            "battery never emits {kind:?} (reference §1.1): {event:?}"
        );
        if let Some(pool) = &self.pool {
            assert!(
                event.pool_name == pool.name && event.pool_namespace == pool.namespace,
                "subscription to {}/{} delivered another pool's event: {event:?}",
                pool.namespace,
                pool.name
            );
        } else if !event.pool_namespace.starts_with(&self.namespace) {
            return;
        }
        assert!(!event.vm_uid.is_empty(), "vm_uid is always set: {event:?}");
        assert!(
            event.payload_json.is_empty(),
            "payload_json is always empty: {event:?}"
        );
        assert!(event.created_at.is_some(), "created_at is set: {event:?}");
        self.history.push(event);
    }

    /// Receives one event before `deadline`; false when none came.
    async fn receive(&mut self, deadline: Instant) -> bool {
        match timeout_at(deadline, self.stream.message()).await {
            Err(_) => false,
            Ok(Ok(Some(event))) => {
                self.accept(event);
                true
            }
            Ok(Ok(None)) => panic!("the event stream ended"),
            Ok(Err(status)) => panic!("the event stream failed: {status}"),
        }
    }

    /// Reads until `check` finds what it wants in the history, and returns it.
    pub async fn wait_until<T>(
        &mut self,
        what: &str,
        mut check: impl FnMut(&[Event]) -> Option<T>,
    ) -> T {
        let deadline = Instant::now() + self.timeout;
        loop {
            if let Some(found) = check(&self.history) {
                return found;
            }
            if !self.receive(deadline).await {
                panic!(
                    "timed out after {:?} waiting for event(s): {what}\nreceived:\n{}",
                    self.timeout,
                    self.describe()
                );
            }
        }
    }

    /// The first event in the history (waiting if needed) matching `pred`.
    pub async fn wait_for(&mut self, what: &str, pred: impl Fn(&Event) -> bool) -> Event {
        self.wait_until(what, |h| h.iter().find(|e| pred(e)).cloned())
            .await
    }

    /// The first `kind` event of the MicroVM `uid`.
    pub async fn wait_vm(&mut self, uid: &str, kind: EventType) -> Event {
        self.wait_for(&format!("{kind:?} for {uid}"), |e| {
            e.vm_uid == uid && e.r#type == kind as i32
        })
        .await
    }

    /// The first `n` events of `kind` in `pool`.
    pub async fn wait_pool_n(&mut self, pool: &PoolRef, kind: EventType, n: usize) -> Vec<Event> {
        let what = format!("{n} {kind:?} in pool {}", pool.name);
        self.wait_until(&what, |h| {
            let found: Vec<Event> = h
                .iter()
                .filter(|e| is_of(e, pool) && e.r#type == kind as i32)
                .take(n)
                .cloned()
                .collect();
            (found.len() == n).then_some(found)
        })
        .await
    }

    /// The MicroVMs of the first `n` events of `kind` in `pool`.
    pub async fn wait_vms(&mut self, pool: &PoolRef, kind: EventType, n: usize) -> Vec<String> {
        let events = self.wait_pool_n(pool, kind, n).await;
        events.into_iter().map(|e| e.vm_uid).collect()
    }

    /// The MicroVM of the `n`th (1-based) `kind` event in `pool`.
    pub async fn wait_nth_vm(&mut self, pool: &PoolRef, kind: EventType, n: usize) -> String {
        let mut vms = self.wait_vms(pool, kind, n).await;
        vms.pop().expect("n >= 1")
    }

    /// Keeps reading for `window`, returning what arrived (for "nothing else happens").
    pub async fn observe(&mut self, window: Duration) -> Vec<Event> {
        let before = self.history.len();
        let deadline = Instant::now() + window;
        while self.receive(deadline).await {}
        self.history[before..].to_vec()
    }

    /// The types of the events of MicroVM `uid`, in order.
    pub fn types_of(&self, uid: &str) -> Vec<EventType> {
        self.history
            .iter()
            .filter(|e| e.vm_uid == uid)
            .map(event_type)
            .collect()
    }

    /// The MicroVMs of `pool` with a `kind` event, in event order, without repeats.
    pub fn vms_with(&self, pool: &PoolRef, kind: EventType) -> Vec<String> {
        let mut uids: Vec<String> = Vec::new();
        for e in &self.history {
            if is_of(e, pool) && e.r#type == kind as i32 && !uids.contains(&e.vm_uid) {
                uids.push(e.vm_uid.clone());
            }
        }
        uids
    }

    /// The VMs of `pool` provisioned and not yet ended (AVAILABLE, hook-failed or
    /// deleted), in event order.
    pub fn in_flight(&self, pool: &PoolRef) -> Vec<String> {
        self.vms_with(pool, EventType::VmProvisioned)
            .into_iter()
            .filter(|uid| !self.types_of(uid).iter().any(|kind| ends_bring_up(*kind)))
            .collect()
    }

    /// The history, one line per event (for failure messages).
    pub fn describe(&self) -> String {
        self.history
            .iter()
            .map(|e| {
                format!(
                    "  #{} {}/{} {} {:?}",
                    e.id,
                    e.pool_namespace,
                    e.pool_name,
                    e.vm_uid,
                    event_type(e)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Whether `event` belongs to `pool`.
pub(crate) fn is_of(event: &Event, pool: &PoolRef) -> bool {
    event.pool_name == pool.name && event.pool_namespace == pool.namespace
}

/// Whether an event of `kind` ends a VM's bring-up, one way or another.
fn ends_bring_up(kind: EventType) -> bool {
    matches!(
        kind,
        EventType::VmAvailable
            | EventType::VmHookFailed
            | EventType::VmDeletedOnPoolDelete
            | EventType::VmDeletedDueToExpiry
            | EventType::VmDeletedOnRelease
    )
}
