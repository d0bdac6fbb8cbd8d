//! The Nsight Compute parser and the bottleneck classifier on real ncu outputs (tests/fixtures/ncu).
use crate::common;
use common::*;
use flashtune::gpu::profile::{classify, no_kernels_profiled, parse_raw_csv};
use flashtune::model::config::Policies;

fn rules() -> Vec<flashtune::model::config::BottleneckRule> {
    Policies::load(&repo().join("policies.toml"))
        .unwrap()
        .0
        .profile
        .bottlenecks
}

#[test]
fn raw_page_by_header_name_with_units_and_separators() {
    let k = parse_raw_csv(&fixture("ncu/saxpy_raw_import.csv")).unwrap();
    assert_eq!(k.len(), 2);
    assert_eq!(k[0].kernel, "saxpy");
    assert_eq!(k[0].grid_size, "(16384, 1, 1)");
    let t = &k[0].metrics["gpu__time_duration.sum"];
    assert_eq!((t.value, t.unit.as_str()), (65920.0, "ns"));
    assert_eq!(k[1].get("gpu__time_duration.sum"), Some(66304.0));
    assert_eq!(k[0].get("launch__waves_per_multiprocessor"), Some(62.06));
    assert_eq!(
        k[0].get("dram__throughput.avg.pct_of_peak_sustained_elapsed"),
        Some(57.75)
    );
}

#[test]
fn mixed_stdout_is_skipped_and_split_kv_has_two_kernels() {
    let k = parse_raw_csv(&fixture("ncu/torch_sdpa_flash_1_8_512_64_mixed_stdout.csv")).unwrap();
    assert_eq!(k.len(), 3);
    assert!(k[0].kernel.starts_with("void flash_fwd_splitkv_kernel"));
    assert!(k[1]
        .kernel
        .starts_with("void flash_fwd_splitkv_combine_kernel"));
    assert_eq!(k[0].get("gpu__time_duration.sum"), Some(7584.0));
    assert_eq!(k[1].get("gpu__time_duration.sum"), Some(5856.0));
    for f in [
        "torch_sdpa_cudnn_1_8_512_64_mixed_stdout.csv",
        "torch_sdpa_cudnn_8_32_2048_64_mixed_stdout.csv",
        "torch_sdpa_flash_8_32_2048_64_mixed_stdout.csv",
    ] {
        let k = parse_raw_csv(&fixture(&format!("ncu/{f}"))).unwrap();
        assert!(
            !k.is_empty() && k.iter().all(|k| k.get("gpu__time_duration.sum").is_some()),
            "{f}"
        );
    }
}

#[test]
fn no_kernels_profiled_is_recognised() {
    let out = fixture("ncu/no_kernels_profiled.txt");
    assert!(no_kernels_profiled(&out));
    assert!(parse_raw_csv(&out).is_err());
    assert!(!no_kernels_profiled(&fixture("ncu/profile_run_stdout.txt")));
}

#[test]
fn classifier_names_the_bottleneck_from_real_numbers() {
    // PyTorch's split-KV flash kernel at the seed shape: 0.48 waves.
    let flash =
        parse_raw_csv(&fixture("ncu/torch_sdpa_flash_1_8_512_64_mixed_stdout.csv")).unwrap();
    let named = classify(&flash[0], &rules());
    assert_eq!(
        named.first().map(String::as_str),
        Some("grid too small (waves < 1)"),
        "{named:?}"
    );
    // saxpy: 62 waves, SM 30%, DRAM 58%: neither memory bound by the 60% rule nor grid-limited.
    let saxpy = parse_raw_csv(&fixture("ncu/saxpy_raw_import.csv")).unwrap();
    let named = classify(&saxpy[0], &rules());
    assert!(
        !named.iter().any(|n| n.starts_with("grid too small")),
        "{named:?}"
    );
}
