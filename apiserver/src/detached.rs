//! Work that must finish even if whoever awaits it goes away, run on the awaiting task
//! while it stays: see [`Detachable`].

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// A future polled on the task that awaits it, and, if that task drops it unfinished
/// (a request whose client disconnected), run to completion on a task of its own, its
/// output dropped. What `tokio::spawn` then joining guarantees, without handing a
/// request's work to another worker thread, a wake-up every lone request pays for.
#[must_use = "a future does nothing unless awaited"]
pub struct Detachable<F: Future + Send + 'static>(Option<Pin<Box<F>>>);

impl<F: Future + Send + 'static> Detachable<F> {
    pub fn new(future: F) -> Self {
        Self(Some(Box::pin(future)))
    }
}

impl<F: Future + Send + 'static> Future for Detachable<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // Out while polled: one that panics is dropped with the panic, not run again.
        let mut future = self
            .0
            .take()
            .expect("a Detachable is not polled after it completed");
        let polled = future.as_mut().poll(cx);
        if polled.is_pending() {
            self.0 = Some(future);
        }
        polled
    }
}

impl<F: Future + Send + 'static> Drop for Detachable<F> {
    fn drop(&mut self) {
        // Moving the box moves no pinned data: the future stays where it was polled.
        if let Some(future) = self.0.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(async move {
                future.await;
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::oneshot;

    use super::*;

    #[tokio::test]
    async fn answers_what_its_future_answers() {
        assert_eq!(Detachable::new(async { 7 }).await, 7);
    }

    #[tokio::test]
    async fn finishes_on_a_task_of_its_own_when_dropped_unfinished() {
        let (go, wait) = oneshot::channel::<()>();
        let (finished, done) = oneshot::channel();
        let mut work = Detachable::new(async move {
            wait.await.expect("told to go on");
            finished.send(()).expect("the test waits");
        });
        // Polled once, so it started on this task, then dropped as a request would be.
        assert!(futures::poll!(&mut work).is_pending());
        drop(work);
        go.send(()).expect("the detached work waits");
        // Its sender dropped unsent, had the work been dropped with its request.
        done.await.expect("the detached work finished");
    }
}
