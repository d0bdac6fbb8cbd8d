//! The PyTorch (and FlashAttention-4) reference adapter: its protocol, rows that become timings or reasons, noisy rows timed again, a crash reported, not fatal.
use crate::common;
use common::*;
use flashtune::gpu::baseline;
use flashtune::model::config::Policies;
use std::path::Path;
use std::process::Command;

fn policies_with(command: Vec<String>) -> Policies {
    let (mut p, _) = Policies::load(&repo().join("policies.toml")).unwrap();
    p.baseline.command = command;
    p.measure.samples = 5;
    p
}

fn shapes(p: &Policies) -> Vec<flashtune::model::config::Shape> {
    p.shapes
        .iter()
        .filter(|s| s.name == "small")
        .cloned()
        .collect()
}

#[tokio::test]
async fn adapter_without_pytorch_says_why() {
    // A `torch` that cannot be imported, whatever this machine has installed.
    let fake = tempfile::tempdir().unwrap();
    std::fs::create_dir(fake.path().join("torch")).unwrap();
    std::fs::write(
        fake.path().join("torch/__init__.py"),
        "raise ImportError('simulated: no torch here')\n",
    )
    .unwrap();
    let script = repo().join("baselines/torch_sdpa.py");
    let cmd = vec![
        "env".into(),
        format!("PYTHONPATH={}", fake.path().display()),
        "python3".into(),
        script.display().to_string(),
    ];
    let p = policies_with(cmd);
    let err = baseline::measure(&repo(), &p, &shapes(&p))
        .await
        .expect_err("no torch, no figures");
    assert!(
        err.contains("PyTorch is not importable") && err.contains("simulated"),
        "{err}"
    );
}

#[tokio::test]
async fn adapter_rows_become_timings_or_reasons() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("adapter.py");
    std::fs::write(
            &script,
            r#"import json, sys
req = json.load(sys.stdin)
assert req["shapes"][0]["name"] == "small" and req["samples"] == 5
rows = [{"shape": "small", "dtype": "f16", "backend": "flash", "samples_us": [3.0, 1.0, 2.0, 5.0, 4.0], "launches_per_sample": 100},
        {"shape": "small", "dtype": "bf16", "backend": "flash", "error": "RuntimeError: no kernel"}]
print(json.dumps({"torch": "x", "gpu": "y", "rows": rows}))
"#,
        )
        .unwrap();
    let p = policies_with(vec!["python3".into(), script.display().to_string()]);
    let rows = baseline::measure(&repo(), &p, &shapes(&p)).await.unwrap();
    assert_eq!(rows.len(), 2);
    let timing = rows[0].outcome.as_ref().unwrap();
    assert_eq!((timing.median_us, timing.launches_per_sample), (3.0, 100));
    assert_eq!(
        rows[1].outcome.as_ref().unwrap_err(),
        "RuntimeError: no kernel"
    );
}

/// An adapter that answers call N with `replies[N]` (the last one again after that) and keeps
/// every request it was sent as request-N.json beside itself.
fn scripted_adapter(dir: &Path, replies: &[serde_json::Value]) -> Vec<String> {
    let replies = serde_json::to_string(replies).unwrap();
    let script = dir.join("adapter.py");
    std::fs::write(
        &script,
        format!(
            r#"import json, os, sys
here = os.path.dirname(os.path.abspath(__file__))
n = len([f for f in os.listdir(here) if f.startswith("request-")])
req = json.load(sys.stdin)
json.dump(req, open(os.path.join(here, f"request-{{n}}.json"), "w"))
replies = json.loads({replies:?})
print(json.dumps(replies[min(n, len(replies) - 1)]))
"#
        ),
    )
    .unwrap();
    vec!["python3".into(), script.display().to_string()]
}

fn sent(dir: &Path) -> Vec<serde_json::Value> {
    (0..)
        .map(|n| dir.join(format!("request-{n}.json")))
        .take_while(|p| p.exists())
        .map(|p| serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap())
        .collect()
}

fn row(backend: &str, samples: &[f64]) -> serde_json::Value {
    serde_json::json!({"shape": "small", "dtype": "f16", "backend": backend,
            "samples_us": samples, "launches_per_sample": 50})
}

/// Twelve samples around 10.6 µs, one a tenth slower: spread (p90 - p10) / median = 0.4%.
const TIGHT: [f64; 12] = [
    10.55, 10.6, 10.6, 10.6, 10.6, 10.6, 10.6, 10.6, 10.6, 10.62, 10.65, 11.7,
];
/// The clock or a neighbour disturbed half the run: median 42 µs, spread far above 5%.
const DISTURBED: [f64; 12] = [
    10.6, 10.6, 10.7, 10.8, 11.0, 30.0, 54.0, 70.0, 73.8, 74.0, 75.0, 80.0,
];

#[tokio::test]
async fn a_noisy_row_is_timed_again_and_the_tightest_timing_kept() {
    let dir = tempfile::tempdir().unwrap();
    let command = scripted_adapter(
        dir.path(),
        &[
            serde_json::json!({"rows": [row("flash", &DISTURBED), row("cudnn", &TIGHT)],
                    "ceilings": [{"name": "copy", "dtype": null, "value": 3000.0, "unit": "GB/s"}]}),
            serde_json::json!({"rows": [row("flash", &TIGHT)], "ceilings": []}),
        ],
    );
    let mut p = policies_with(command);
    p.baseline.backends = vec!["flash".into(), "cudnn".into()];
    let (rows, ceilings) = baseline::measure_with_ceilings(&repo(), &p, &shapes(&p))
        .await
        .unwrap();
    assert_eq!(ceilings.len(), 1);
    let flash = &rows[0];
    let t = flash.outcome.as_ref().unwrap();
    assert_eq!(
        (t.median_us, flash.remeasured, flash.noisy),
        (10.6, 1, false)
    );
    assert_eq!((rows[1].remeasured, rows[1].noisy), (0, false));
    // The second call re-timed only what was noisy, and measured no roofs again.
    let requests = sent(dir.path());
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0]["ceilings"], true);
    assert_eq!(requests[1]["backends"], serde_json::json!(["flash"]));
    assert_eq!(requests[1]["dtypes"], serde_json::json!(["f16"]));
    assert_eq!(requests[1]["ceilings"], false);
    assert_eq!(requests[1]["shapes"][0]["name"], "small");
    // Exactly the noisy rows, not every row of their shapes, dtypes and backends.
    assert_eq!(
        requests[1]["only"],
        serde_json::json!([["small", "f16", "flash"]])
    );
    assert!(requests[0].get("only").is_none());
}

#[tokio::test]
async fn a_row_that_stays_noisy_is_reported_as_noisy() {
    let dir = tempfile::tempdir().unwrap();
    let command = scripted_adapter(
        dir.path(),
        &[serde_json::json!({"rows": [row("flash", &DISTURBED)]})],
    );
    let p = policies_with(command);
    assert_eq!((p.baseline.max_spread, p.baseline.remeasure), (0.05, 2));
    let rows = baseline::measure(&repo(), &p, &shapes(&p)).await.unwrap();
    let flash = &rows[0];
    assert!(flash.spread().unwrap() > 0.05);
    assert_eq!((flash.remeasured, flash.noisy), (2, true));
    assert_eq!(
        sent(dir.path()).len(),
        3,
        "measured once, re-measured twice"
    );
}

#[tokio::test]
async fn the_request_names_every_backend_each_shape_s_input_sets_and_the_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let command = scripted_adapter(dir.path(), &[serde_json::json!({"rows": []})]);
    let p = policies_with(command);
    let sets = std::collections::BTreeMap::from([("small".to_owned(), 4u32)]);
    baseline::measure_rotating(&repo(), &p, &shapes(&p), &sets, 1, false)
        .await
        .unwrap();
    let request = &sent(dir.path())[0];
    assert_eq!(
        request["backends"],
        serde_json::json!(["flash", "cudnn", "efficient", "default", "fa4"])
    );
    assert_eq!(request["shapes"][0]["sets"], 4);
    // The GPU it runs on, as the workers count them, and no roofs where another adapter takes them.
    assert_eq!(request["device"], 1);
    assert_eq!(request["ceilings"], false);
}

/// A stand-in for PyTorch that runs the adapter on a CPU: every attention call is logged (the
/// input set it read, the mask, the backend forced), a captured graph replays its calls.
const FAKE_TORCH: [(&str, &str); 6] = [
    (
        "torch/__init__.py",
        r#""""A stand-in for PyTorch that runs baselines/torch_sdpa.py on a CPU and logs every attention call."""
import itertools, json, os
from . import cuda, nn
__version__ = "fake"
float16, bfloat16, float32, uint8 = "float16", "bfloat16", "float32", "uint8"
_ids = itertools.count()
class Tensor:
    """Only an id and a shape: arithmetic gives a new tensor of the left operand's shape."""
    def __init__(self, shape):
        self.id, self.shape = next(_ids), tuple(shape)
    def _like(self, *_):
        return Tensor(self.shape)
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __and__ = __eq__ = __ge__ = __le__ = _like
    __hash__ = object.__hash__
    float = contiguous = _like
    __getitem__ = _like
    def to(self, dtype): return Tensor(self.shape)
    def scatter_(self, dim, index, value): return self
    def view(self, *shape):
        n = 1
        for s in self.shape: n *= s
        known = 1
        for s in shape: known *= s if s != -1 else 1
        return Tensor([n // known if s == -1 else s for s in shape])
    def transpose(self, a, b):
        s = list(self.shape)
        s[a], s[b] = s[b], s[a]
        return Tensor(s)
class Generator:
    def __init__(self, device=None): pass
    def manual_seed(self, seed): return self
def randn(*shape, device=None, dtype=None, generator=None): return Tensor(shape)
def randint(low, high, size, device=None, generator=None): return Tensor(size)
def zeros(*shape, device=None, dtype=None): return Tensor(shape)
def ones_like(x): return Tensor(x.shape)
def remainder(a, b): return Tensor(a.shape)
def where(cond, a, b): return Tensor(a.shape)
def log(entry):
    with open(os.environ["FAKE_TORCH_LOG"], "a") as f:
        f.write(json.dumps(entry) + "\n")
"#,
    ),
    (
        "torch/cuda/__init__.py",
        r#"import contextlib
_capturing = []
def is_available(): return True
def device_count(): return 1
def set_device(device): pass
def get_device_name(): return "fake"
def synchronize(): pass
class Event:
    def __init__(self, enable_timing=False): pass
    def record(self): pass
    def synchronize(self): pass
    def elapsed_time(self, end): return 0.001  # 1 µs per call or replay
class Stream:
    def wait_stream(self, other): pass
def current_stream(): return Stream()
@contextlib.contextmanager
def stream(s): yield
class CUDAGraph:
    def __init__(self): self.calls = []
    def replay(self):
        for call in self.calls: call()
@contextlib.contextmanager
def graph(g):
    _capturing.append(g)
    try: yield
    finally: _capturing.pop()
"#,
    ),
    (
        "torch/nn/__init__.py",
        r#"from . import attention, functional
"#,
    ),
    (
        "torch/nn/functional.py",
        r#"import torch
from torch.nn import attention
def scaled_dot_product_attention(q, k, v, attn_mask=None, is_causal=False):
    entry = {"q": q.id, "is_causal": is_causal, "backend": attention._current,
             "mask": None if attn_mask is None else attn_mask.variant}
    graphs = torch.cuda._capturing
    if graphs:  # captured: logged when the graph replays
        graphs[-1].calls.append(lambda: torch.log(dict(entry, replayed=True)))
    else:
        torch.log(entry)
"#,
    ),
    (
        "torch/nn/attention/__init__.py",
        r#"import contextlib, enum
class SDPBackend(enum.Enum):
    FLASH_ATTENTION = "flash"; CUDNN_ATTENTION = "cudnn"; EFFICIENT_ATTENTION = "efficient"; MATH = "math"
_current = None
@contextlib.contextmanager
def sdpa_kernel(backend):
    global _current
    _current, before = backend.value, _current
    try: yield
    finally: _current = before
"#,
    ),
    (
        "torch/nn/attention/bias.py",
        r#"class CausalBias:
    def __init__(self, variant, sq, sk): self.variant, self.sq, self.sk = variant, sq, sk
def causal_lower_right(sq, sk): return CausalBias("lower_right", sq, sk)
"#,
    ),
];

/// The adapter's JSON reply to `request` on its stdin; it must exit 0.
fn adapter_reply(mut cmd: Command, request: &serde_json::Value) -> serde_json::Value {
    cmd.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(request.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A folder holding the PyTorch stand-in, for PYTHONPATH.
fn fake_torch() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (path, text) in FAKE_TORCH {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    dir
}

#[test]
fn the_adapter_rotates_input_sets_and_aligns_the_causal_mask() {
    let dir = fake_torch();
    let calls_log = dir.path().join("calls.jsonl");
    let request = serde_json::json!({
            "shapes": [
                {"name": "decode", "b": 1, "h": 1, "sq": 3, "sk": 7, "d": 64, "causal": "bottom-right", "sets": 3},
                {"name": "square", "b": 1, "h": 1, "sq": 3, "sk": 3, "d": 64, "causal": true},
                {"name": "plain", "b": 1, "h": 1, "sq": 3, "sk": 3, "d": 64, "causal": "none"}],
            "dtypes": ["f16"], "backends": ["flash", "default", "bogus"],
            "warmup_ms": 0, "samples": 2, "min_sample_us": 10, "seed": 1, "ceilings": false});
    let mut cmd = Command::new("python3");
    cmd.arg(repo().join("baselines/torch_sdpa.py"))
        .env("PYTHONPATH", dir.path())
        .env("FAKE_TORCH_LOG", &calls_log)
        .env("PYTHONPYCACHEPREFIX", dir.path().join("pycache"));
    let reply = adapter_reply(cmd, &request);
    let rows = reply["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 9);
    // 1 µs a call and 10 µs a sample make 10 calls, rounded up to whole rounds of 3 sets.
    assert_eq!(rows[0]["launches_per_sample"], 12);
    assert_eq!(rows[3]["launches_per_sample"], 10);
    assert!(rows[2]["error"]
        .as_str()
        .unwrap()
        .contains("unknown backend 'bogus'"));
    let calls: Vec<serde_json::Value> = std::fs::read_to_string(&calls_log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let replayed = |backend: serde_json::Value, mask: serde_json::Value, causal: bool| {
        calls
            .iter()
            .filter(|c| {
                c["replayed"] == true
                    && c["backend"] == backend
                    && c["mask"] == mask
                    && c["is_causal"] == causal
            })
            .map(|c| c["q"].as_u64().unwrap())
            .collect::<Vec<u64>>()
    };
    // Bottom-right: PyTorch's causal_lower_right as the mask, is_causal off; the timed calls
    // read three distinct input sets in turn, 2 samples x 12 calls.
    let flash = replayed(
        serde_json::json!("flash"),
        serde_json::json!("lower_right"),
        false,
    );
    assert_eq!(flash.len(), 24);
    assert!(flash[0] != flash[1] && flash[1] != flash[2] && flash[0] != flash[2]);
    assert!(flash.chunks(3).all(|c| c == &flash[..3]), "{flash:?}");
    // "default" forces no backend.
    assert_eq!(
        replayed(
            serde_json::Value::Null,
            serde_json::json!("lower_right"),
            false
        )
        .len(),
        24
    );
    // true is top-left (is_causal), "none" no mask at all; one input set each.
    let top_left = replayed(serde_json::json!("flash"), serde_json::Value::Null, true);
    assert_eq!(top_left.len(), 20);
    assert!(top_left.iter().all(|q| *q == top_left[0]));
    assert_eq!(
        replayed(serde_json::json!("flash"), serde_json::Value::Null, false).len(),
        20
    );
}

/// FA4 in the adapter: absent, each of its rows says "not installed" and the others are timed;
/// present (a stand-in in the folder FLASHTUNE_FA4_SITE names), it is called in its own
/// (batch, seqlen, heads, dim) layout, its causal flag on for bottom-right and square masks,
/// rotating over the input sets, and a top-left mask with Sq != Sk (not FA4's) is refused.
#[test]
fn the_adapter_times_fa4_where_installed_and_says_so_where_not() {
    let dir = fake_torch();
    let site = dir.path().join("fa4-site");
    std::fs::create_dir_all(site.join("flash_attn/cute")).unwrap();
    std::fs::write(site.join("flash_attn/__init__.py"), "").unwrap();
    std::fs::write(
        site.join("flash_attn/cute/__init__.py"),
        r#"import torch
def flash_attn_func(q, k, v, causal=False):
    entry = {"q": q.id, "q_shape": list(q.shape), "is_causal": causal, "backend": "fa4"}
    graphs = torch.cuda._capturing
    if graphs:
        graphs[-1].calls.append(lambda: torch.log(dict(entry, replayed=True)))
    else:
        torch.log(entry)
"#,
    )
    .unwrap();
    let calls_log = dir.path().join("calls.jsonl");
    let request = serde_json::json!({
            "shapes": [
                {"name": "decode", "b": 2, "h": 4, "sq": 3, "sk": 7, "d": 64, "causal": "bottom-right", "sets": 3},
                {"name": "square", "b": 1, "h": 1, "sq": 3, "sk": 3, "d": 64, "causal": true},
                {"name": "plain", "b": 1, "h": 1, "sq": 3, "sk": 3, "d": 64, "causal": "none"},
                {"name": "tl-ragged", "b": 1, "h": 1, "sq": 3, "sk": 7, "d": 64, "causal": "top-left"}],
            "dtypes": ["f16"], "backends": ["flash", "fa4"],
            "warmup_ms": 0, "samples": 2, "min_sample_us": 10, "seed": 1, "ceilings": false});
    let adapter = |fa4_site: Option<&Path>| {
        let mut cmd = Command::new("python3");
        cmd.arg(repo().join("baselines/torch_sdpa.py"))
            .env("PYTHONPATH", dir.path())
            .env("FAKE_TORCH_LOG", &calls_log)
            .env("PYTHONPYCACHEPREFIX", dir.path().join("pycache"))
            .env_remove("FLASHTUNE_FA4_SITE");
        if let Some(s) = fa4_site {
            cmd.env("FLASHTUNE_FA4_SITE", s);
        }
        let reply = adapter_reply(cmd, &request);
        reply["rows"].as_array().unwrap().clone()
    };
    let absent = adapter(None);
    assert_eq!(absent.len(), 8);
    for row in absent.iter().filter(|r| r["backend"] == "fa4") {
        assert!(
            row["error"]
                .as_str()
                .unwrap()
                .contains("flash-attn-4 not installed"),
            "{row}"
        );
    }
    assert!(absent
        .iter()
        .filter(|r| r["backend"] == "flash")
        .all(|r| r["samples_us"].is_array()));
    std::fs::remove_file(&calls_log).ok();
    let present = adapter(Some(&site));
    let fa4: Vec<&serde_json::Value> = present.iter().filter(|r| r["backend"] == "fa4").collect();
    assert!(
        fa4[..3].iter().all(|r| r["samples_us"].is_array()),
        "{fa4:?}"
    );
    assert!(
        fa4[3]["error"].as_str().unwrap().contains("bottom-right"),
        "{}",
        fa4[3]
    );
    let calls: Vec<serde_json::Value> = std::fs::read_to_string(&calls_log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|c: &serde_json::Value| c["backend"] == "fa4" && c["replayed"] == true)
        .collect();
    let decode: Vec<&serde_json::Value> = calls
        .iter()
        .filter(|c| c["q_shape"] == serde_json::json!([2, 3, 4, 64]))
        .collect();
    assert_eq!(decode.len(), 24, "{calls:?}");
    assert!(decode.iter().all(|c| c["is_causal"] == true));
    let ids: std::collections::BTreeSet<u64> =
        decode.iter().map(|c| c["q"].as_u64().unwrap()).collect();
    assert_eq!(ids.len(), 3, "three input sets in turn");
    let square_causal = calls
        .iter()
        .filter(|c| c["q_shape"] == serde_json::json!([1, 3, 1, 64]) && c["is_causal"] == true)
        .count();
    let plain = calls
        .iter()
        .filter(|c| c["q_shape"] == serde_json::json!([1, 3, 1, 64]) && c["is_causal"] == false)
        .count();
    assert_eq!((square_causal, plain), (20, 20));
}

#[test]
fn the_adapter_script_compiles() {
    let out = Command::new("python3")
        .args(["-m", "py_compile"])
        .arg(repo().join("baselines/torch_sdpa.py"))
        .env("PYTHONPYCACHEPREFIX", tempfile::tempdir().unwrap().path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
}

#[tokio::test]
async fn a_crashing_adapter_is_reported_not_fatal() {
    let p = policies_with(vec![
        "python3".into(),
        "-c".into(),
        "import sys; print('boom', file=sys.stderr); sys.exit(7)".into(),
    ]);
    let err = baseline::measure(&repo(), &p, &shapes(&p))
        .await
        .err()
        .unwrap();
    assert!(err.contains("boom"), "{err}");
}

/// The adapter times only the rows "only" names (a re-timing of noisy rows), and says how long each
/// row and its own start took.
#[test]
fn the_adapter_times_only_the_rows_it_is_told_and_says_how_long_each_took() {
    let dir = fake_torch();
    let request = serde_json::json!({
            "shapes": [
                {"name": "square", "b": 1, "h": 1, "sq": 3, "sk": 3, "d": 64, "causal": true},
                {"name": "plain", "b": 1, "h": 1, "sq": 3, "sk": 3, "d": 64, "causal": "none"}],
            "dtypes": ["f16", "bf16"], "backends": ["flash", "default"],
            "warmup_ms": 0, "samples": 2, "min_sample_us": 10, "seed": 1, "ceilings": false,
            "only": [["plain", "bf16", "default"]]});
    let mut cmd = Command::new("python3");
    cmd.arg(repo().join("baselines/torch_sdpa.py"))
        .env("PYTHONPATH", dir.path())
        .env("FAKE_TORCH_LOG", dir.path().join("calls.jsonl"))
        .env("PYTHONPYCACHEPREFIX", dir.path().join("pycache"));
    let reply = adapter_reply(cmd, &request);
    let rows = reply["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(
        (&rows[0]["shape"], &rows[0]["dtype"], &rows[0]["backend"]),
        (
            &serde_json::json!("plain"),
            &serde_json::json!("bf16"),
            &serde_json::json!("default")
        )
    );
    assert!(rows[0]["seconds"].as_f64().is_some_and(|s| s >= 0.0));
    assert!(reply["startup_s"].as_f64().is_some_and(|s| s >= 0.0));
}
