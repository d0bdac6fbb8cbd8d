//! Timing summaries: percentiles and the median, p10, p90 and TFLOP/s of a case's samples.
use crate::model::protocol::TimingStats;

pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = p / 100.0 * (sorted.len() - 1) as f64;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64)
}

pub fn summarize(samples_us: Vec<f64>, launches_per_sample: u32, flops: f64) -> TimingStats {
    let mut sorted = samples_us.clone();
    sorted.sort_by(f64::total_cmp);
    let median_us = percentile(&sorted, 50.0);
    TimingStats {
        samples_us,
        launches_per_sample,
        median_us,
        p10_us: percentile(&sorted, 10.0),
        p90_us: percentile(&sorted, 90.0),
        tflops: flops / (median_us * 1e-6) / 1e12,
    }
}
