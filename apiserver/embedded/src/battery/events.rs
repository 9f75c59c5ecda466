//! `poolmgr.v1alpha1.Events` (§4.6), as poolmgrd serves it: every Subscribe reads the
//! outbox from id 0 in id order, 100 events at a time, at once again after a full batch
//! and otherwise after the poll interval (1 s), for as long as the client stays. Waking
//! on each commit instead is an extension of ours, off by default.

use std::sync::Arc;
use std::time::Duration;

use battery_proto::poolmgr::v1alpha1::events_server::Events;
use battery_proto::poolmgr::v1alpha1::{Event, SubscribeRequest};
use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::config::DEFAULT_POLL_INTERVAL;
use super::engine::Engine;
use super::model::PoolKey;

/// battery reads the outbox 100 events at a time and fetches again at once after a
/// full batch.
const BATCH: usize = 100;

pub(crate) struct EventsService {
    engine: Arc<Engine>,
}

impl EventsService {
    pub(crate) fn new(engine: Arc<Engine>) -> Self {
        Self { engine }
    }
}

#[tonic::async_trait]
impl Events for EventsService {
    type SubscribeStream = ReceiverStream<Result<Event, Status>>;

    async fn subscribe(
        &self,
        request: Request<SubscribeRequest>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        // The filter is exact (name and namespace) when `pool` is set.
        let pool = request
            .into_inner()
            .pool
            .map(|pool| PoolKey::of_ref(Some(&pool)));
        let (sender, receiver) = mpsc::channel(BATCH);
        let engine = Arc::clone(&self.engine);
        if !self.engine.spawn(stream(engine, pool, sender)) {
            return Err(Status::unavailable("battery is shutting down"));
        }
        Ok(Response::new(ReceiverStream::new(receiver)))
    }
}

/// Feeds one subscription until the client goes away, the store fails (INTERNAL) or
/// the battery shuts down (UNAVAILABLE: the stream is cut).
async fn stream(
    engine: Arc<Engine>,
    pool: Option<PoolKey>,
    sender: mpsc::Sender<Result<Event, Status>>,
) {
    let shutdown = engine.shutdown_token().clone();
    let config = &engine.config;
    let mut commits = config
        .extension_events_on_commit
        .then(|| engine.store.watch_events());
    let period = match config.event_poll_interval {
        Duration::ZERO => DEFAULT_POLL_INTERVAL,
        period => period,
    };
    // poolmgrd's ticker: created with the stream, a missed tick delivered once.
    let mut ticker = tokio::time::interval_at(Instant::now() + period, period);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let mut last_sent = 0;
    loop {
        // Mark the newest commit seen before reading, so a commit after the read wakes us.
        if let Some(commits) = commits.as_mut() {
            commits.borrow_and_update();
        }
        let batch = match engine.store.events_after(last_sent, pool.as_ref(), BATCH) {
            Ok(batch) => batch,
            Err(err) => {
                let _ = sender.send(Err(Status::internal(err.to_string()))).await;
                return;
            }
        };
        let full = batch.len() == BATCH;
        for event in batch {
            last_sent = event.id;
            tokio::select! {
                sent = sender.send(Ok(event)) => {
                    if sent.is_err() {
                        return;
                    }
                }
                () = shutdown.cancelled() => return cut(&sender),
            }
        }
        let wait = async {
            if full {
                // More may be pending: read again at once, after the tests' pause if any.
                tokio::time::sleep(config.replay_batch_pause).await;
            } else if let Some(commits) = commits.as_mut() {
                // Never an error: the sender lives in the store, which this task holds.
                let _ = commits.changed().await;
            } else {
                ticker.tick().await;
            }
        };
        tokio::select! {
            () = wait => {}
            () = sender.closed() => return,
            () = shutdown.cancelled() => return cut(&sender),
        }
    }
}

fn cut(sender: &mpsc::Sender<Result<Event, Status>>) {
    // try_send: a client that stopped reading must not hold up the shutdown.
    let _ = sender.try_send(Err(Status::unavailable("battery is shutting down")));
}
