//! Large host-memory copies and comparisons on several threads: one thread moves about 8 GB/s on
//! an H200 host, eight about 70 (the worker's outputs of a large case are 64 MiB a launch, read
//! back, uploaded and compared several times per case).

/// Below this many bytes one thread does it: spawning threads costs more than it saves.
const PARALLEL_FROM_BYTES: usize = 4 << 20;
/// Threads at most: beyond this the memory bus, not the cores, limits the copy.
const MAX_THREADS: usize = 8;

fn threads() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(MAX_THREADS)
}

/// `dst` becomes `src` (equal lengths).
pub fn copy<T: Copy + Send + Sync>(src: &[T], dst: &mut [T]) {
    assert_eq!(
        src.len(),
        dst.len(),
        "copy between slices of different lengths"
    );
    let n = threads();
    if std::mem::size_of_val(src) < PARALLEL_FROM_BYTES || n == 1 {
        dst.copy_from_slice(src);
        return;
    }
    let chunk = src.len().div_ceil(n);
    std::thread::scope(|s| {
        for (d, c) in dst.chunks_mut(chunk).zip(src.chunks(chunk)) {
            s.spawn(move || d.copy_from_slice(c));
        }
    });
}

/// Each pair's destination becomes its source (equal lengths): many small copies shared out over
/// the threads by bytes, a large one cut into pieces.
pub fn copy_all(pairs: Vec<(&[u8], &mut [u8])>) {
    let total: usize = pairs.iter().map(|(s, _)| s.len()).sum();
    let n = threads();
    if total < PARALLEL_FROM_BYTES || n == 1 {
        for (src, dst) in pairs {
            dst.copy_from_slice(src);
        }
        return;
    }
    let piece = total.div_ceil(n);
    let mut pieces: Vec<(&[u8], &mut [u8])> = Vec::new();
    for (src, dst) in pairs {
        assert_eq!(
            src.len(),
            dst.len(),
            "copy between slices of different lengths"
        );
        pieces.extend(src.chunks(piece).zip(dst.chunks_mut(piece)));
    }
    // Contiguous runs of pieces, about `piece` bytes each, one thread a run.
    let mut runs: Vec<Vec<(&[u8], &mut [u8])>> = vec![Vec::new()];
    let mut in_run = 0;
    for p in pieces {
        if in_run >= piece {
            runs.push(Vec::new());
            in_run = 0;
        }
        in_run += p.0.len();
        runs.last_mut().expect("one run at least").push(p);
    }
    std::thread::scope(|s| {
        for run in runs {
            s.spawn(move || {
                for (src, dst) in run {
                    dst.copy_from_slice(src);
                }
            });
        }
    });
}

/// Whether `a` and `b` hold the same elements.
pub fn equal<T: PartialEq + Sync>(a: &[T], b: &[T]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let n = threads();
    if std::mem::size_of_val(a) < PARALLEL_FROM_BYTES || n == 1 {
        return a == b;
    }
    let chunk = a.len().div_ceil(n);
    std::thread::scope(|s| {
        let parts: Vec<_> = a
            .chunks(chunk)
            .zip(b.chunks(chunk))
            .map(|(x, y)| s.spawn(move || x == y))
            .collect();
        parts.into_iter().all(|p| p.join().unwrap_or(false))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_and_compares_large_and_small_slices_whole() {
        for len in [0usize, 7, 3 << 20, (5 << 20) + 3] {
            let src: Vec<u16> = (0..len).map(|i| (i * 7919 % 65521) as u16).collect();
            let mut dst = vec![0u16; len];
            copy(&src, &mut dst);
            assert!(equal(&src, &dst), "len {len}");
            if len > 0 {
                // A difference in the last element, the last thread's last chunk, is found.
                dst[len - 1] ^= 1;
                assert!(!equal(&src, &dst), "len {len}");
            }
        }
        assert!(!equal(&[1u16, 2], &[1u16]));
    }

    #[test]
    fn copies_many_slices_of_any_sizes_whole() {
        for sizes in [
            vec![3usize, 0, 5],
            vec![1 << 20; 19],
            vec![(5 << 20) + 7, 11, 3 << 20],
        ] {
            let srcs: Vec<Vec<u8>> = sizes
                .iter()
                .enumerate()
                .map(|(k, &n)| (0..n).map(|i| (i * 31 + k * 7) as u8).collect())
                .collect();
            let mut dsts: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n]).collect();
            copy_all(
                srcs.iter()
                    .map(Vec::as_slice)
                    .zip(dsts.iter_mut().map(Vec::as_mut_slice))
                    .collect(),
            );
            assert_eq!(srcs, dsts, "sizes {sizes:?}");
        }
    }
}
