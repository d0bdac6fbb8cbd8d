//! Work spread over the machine's cores, with scoped threads.

/// Run `work` on every item, the items spread over the machine's cores.
pub fn parallel_chunks<T: Send>(items: Vec<T>, work: impl Fn(T) + Sync) {
    // Asked once: on Linux the answer reads the cgroup's quota, and a verification calls this for
    // every launch it checks.
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let threads =
        *THREADS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if items.len() <= 1 {
        items.into_iter().for_each(work);
        return;
    }
    let per_thread = items.len().div_ceil(threads).max(1);
    let mut groups: Vec<Vec<T>> = Vec::new();
    let mut items = items.into_iter().peekable();
    while items.peek().is_some() {
        groups.push(items.by_ref().take(per_thread).collect());
    }
    let work = &work;
    std::thread::scope(|scope| {
        for group in groups {
            scope.spawn(move || group.into_iter().for_each(work));
        }
    });
}

/// `work` on every item, spread over the cores; results in the items' order.
pub fn parallel_map<T: Sync, R: Send>(items: &[T], work: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let mut results: Vec<Option<R>> = items.iter().map(|_| None).collect();
    let jobs: Vec<(&T, &mut Option<R>)> = items.iter().zip(results.iter_mut()).collect();
    parallel_chunks(jobs, |(item, slot)| *slot = Some(work(item)));
    results
        .into_iter()
        .map(|r| r.expect("every item was worked on"))
        .collect()
}
