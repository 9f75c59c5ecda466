//! The one way we cache answers: every cache is bounded, so none grows with the number
//! of callers.

/// A cache whose entries last `ttl` and that holds at most `capacity` of them, the least
/// used going first.
pub(crate) fn bounded<K, V>(ttl: std::time::Duration, capacity: u64) -> moka::sync::Cache<K, V>
where
    K: std::hash::Hash + Eq + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    moka::sync::Cache::builder()
        .max_capacity(capacity)
        .time_to_live(ttl)
        .build()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn a_bounded_cache_keeps_at_most_its_capacity_and_forgets_after_its_ttl() {
        let cache = super::bounded::<u32, u32>(Duration::from_millis(50), 100);
        for n in 0..10_000 {
            cache.insert(n, n);
        }
        cache.run_pending_tasks();
        assert!(cache.entry_count() <= 100, "{}", cache.entry_count());
        cache.insert(1, 1);
        assert_eq!(cache.get(&1), Some(1));
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(cache.get(&1), None, "expired");
    }
}
