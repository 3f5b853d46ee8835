//! Work done in numbered pieces by several threads and taken in order by one: blocks of a log
//! parsed and merged, rows of an answer rendered and appended.

use std::collections::BTreeMap;
use std::sync::{mpsc, Mutex};

/// Takes numbered pieces as they finish and hands them to `each` in order, moving `window`
/// on. However it stops (a panic included), no worker is left waiting to enter.
pub fn in_order<T>(done: mpsc::Receiver<(usize, T)>, window: &Window, mut each: impl FnMut(T)) {
    struct OpenOnExit<'w>(&'w Window);
    impl Drop for OpenOnExit<'_> {
        fn drop(&mut self) {
            self.0.merged(usize::MAX);
        }
    }
    let _open = OpenOnExit(window);
    let mut waiting = BTreeMap::new();
    let mut next = 0;
    for (index, piece) in done {
        waiting.insert(index, piece);
        while let Some(piece) = waiting.remove(&next) {
            each(piece);
            next += 1;
            window.merged(next);
        }
    }
}

/// How far workers may run ahead of whoever takes their pieces in order (the merge of parsed
/// blocks; the appending of rendered rows). A sink that does real work as blocks are merged
/// (`history` pairs attempts) is slower than two parsers: without a bound, parsed blocks
/// queued for it (~40 MB on the 382 MB log) and `stats` outgrew the file.
pub struct Window {
    merged: Mutex<usize>,
    changed: std::sync::Condvar,
    ahead: usize,
}

impl Window {
    pub fn new(workers: usize) -> Window {
        Window {
            merged: Mutex::new(0),
            changed: std::sync::Condvar::new(),
            ahead: 2 * workers.max(1),
        }
    }

    /// Waits until block `index` is within the window. The next block to merge always is,
    /// so the parse never waits on itself.
    pub fn enter(&self, index: usize) {
        let mut merged = self.merged.lock().unwrap_or_else(|e| e.into_inner());
        while index.saturating_sub(*merged) >= self.ahead {
            merged = self.changed.wait(merged).unwrap_or_else(|e| e.into_inner());
        }
    }

    pub fn merged(&self, count: usize) {
        *self.merged.lock().unwrap_or_else(|e| e.into_inner()) = count;
        self.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsers_never_run_more_than_the_window_ahead_of_a_slow_merge() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let window = Window::new(2);
        let (next, merged, widest) = (
            AtomicUsize::new(0),
            AtomicUsize::new(0),
            AtomicUsize::new(0),
        );
        let (done_tx, done_rx) = mpsc::channel::<usize>();
        std::thread::scope(|scope| {
            for _ in 0..3 {
                let (done_tx, window, next, merged, widest) =
                    (done_tx.clone(), &window, &next, &merged, &widest);
                scope.spawn(move || loop {
                    let index = next.fetch_add(1, Ordering::SeqCst);
                    if index >= 60 {
                        break;
                    }
                    window.enter(index);
                    let gap = index - merged.load(Ordering::SeqCst).min(index);
                    widest.fetch_max(gap, Ordering::SeqCst);
                    let _ = done_tx.send(index);
                });
            }
            drop(done_tx);
            let mut waiting = std::collections::BTreeSet::new();
            for index in done_rx {
                waiting.insert(index);
                while waiting.remove(&merged.load(Ordering::SeqCst)) {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                    let count = merged.fetch_add(1, Ordering::SeqCst) + 1;
                    window.merged(count);
                }
            }
        });
        assert_eq!(
            merged.load(Ordering::SeqCst),
            60,
            "every block merged, none stuck"
        );
        let widest = widest.load(Ordering::SeqCst);
        assert!(widest < window.ahead, "a parser ran {widest} blocks ahead");
        assert!(widest > 0, "the parsers did run ahead of the merge");
    }
}
