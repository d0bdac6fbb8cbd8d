//! The pack as files: AGENTS.md (the standing rules), PROMPT.md (this step's task), context/ (figures, history, sources).
use super::history::HistoryEntry;
use super::ideas::IdeaNote;
use super::{
    BudgetLeft, ContextPack, Sourced, AGENTS_MD_MAX_BYTES, HISTORY_MD_ENTRIES, PACK_MAX_BYTES,
};
use anyhow::{Context, Result};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The tools `flashtune mcp` serves, as AGENTS.md lists them (tests/it/mcp.rs checks the server has each).
pub const MCP_TOOLS: &[(&str, &str)] = &[
    (
        "context",
        "this pack as JSON: rules, cases, figures, bottleneck, ideas to avoid and to retry",
    ),
    (
        "history",
        "every earlier attempt: idea, verdict, reason, per-case figures, metrics, cost",
    ),
    (
        "attempt",
        "one earlier attempt by id, with its whole patch (ready for `git apply`)",
    ),
    (
        "profile",
        "Nsight Compute digest of a variant from a run that timed it",
    ),
    (
        "judge",
        "judge the working tree's edit now (outside an agent session only)",
    ),
    ("judge_status", "wait for a judge or profile job"),
];

pub(super) fn pct(x: Option<f64>) -> String {
    x.map_or("unknown".into(), |x| format!("{:.1}%", x * 100.0))
}

pub(super) fn us(x: Option<&Sourced>) -> String {
    x.map_or("unknown (no log holds it)".into(), |s| {
        format!("{:.2} µs ({})", s.value, s.from)
    })
}

/// AGENTS.md: the standing rules, the same at every step.
pub fn agents_md(pack: &ContextPack) -> String {
    let mut m = String::new();
    let _ = writeln!(
        m,
        "# Rules of this work directory (flashtune)\n\n\
         You are editing CUDA attention kernels. flashtune judges your edit when you stop; you do not\n\
         run the judgement yourself, and nothing you say about your edit is taken into account.\n"
    );
    let _ = writeln!(m, "## What you may change\n");
    let _ = writeln!(
        m,
        "- Only files under `{}`. Everything else is compared with the base commit `{}` and any\n  change outside that folder (a new file included) rejects your whole edit.",
        pack.edit_scope,
        short(&pack.base_commit)
    );
    let _ = writeln!(
        m,
        "- Protected, never edit: {}. The reference kernel is the oracle your outputs are checked against.",
        pack.protected
            .iter()
            .map(|p| format!("`{p}`"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let _ = writeln!(
        m,
        "- Do not commit, switch branches or move HEAD: flashtune commits an accepted edit itself.\n\
         - `AGENTS.md`, `PROMPT.md` and `context/` are flashtune's notes to you; changes to them are ignored.\n\
         - Scratch files belong in `$TMPDIR`, not here.\n"
    );
    let _ = writeln!(m, "## How the verdict is reached\n");
    let _ = writeln!(
        m,
        "1. Your edit is built with nvcc with the champion's parameters (the same -D defines), in a\n   build cache of its own; a build failure or a spill rejected by the gates ends it.\n\
         2. On the GPU, under a lock (one judgement at a time), HEAD's champion and your edit are\n   checked against HEAD's fp32 reference kernel on fresh random inputs (new every step, with\n   poisoned outputs), then timed interleaved (A B, B A, ...), {} rounds per case, on every case\n   listed in PROMPT.md.\n\
         3. The outputs of the timed launches themselves are verified on the host, every input is drawn\n   from one mixture (large scores, aligned and spiky channels, outlier tokens), fresh inputs are\n   checked again after timing, and the inputs must be left untouched.\n\
         4. Accepted only if the geometric mean gain (of HEAD's median ÷ yours) over all cases beats\n   {:.1}% and the median case's noise (HEAD's p10..p90 spread ÷ median), no case is slower by\n   more than the larger of HEAD's noise there and {:.1}%, and on no case is your spread more than\n   twice HEAD's and 5 points above it (unstable).\n",
        pack.rounds,
        pack.threshold * 100.0,
        pack.threshold * 100.0
    );
    let _ = writeln!(m, "## What gets an edit rejected\n");
    let _ = writeln!(
        m,
        "- **wrong**: outputs differ from the reference beyond the dtype's tolerance, NaN, unwritten outputs.\n\
         - **timed outputs differ**: the launches that were timed did not compute the answer (caching by\n  pointer, skipping launches, reading a previous set's output, races between runs).\n\
         - **implausible**: a time faster than the GPU's measured roofs allow (dense matmul, memory bandwidth).\n\
         - **slower** on any case beyond its noise and the threshold, or a geomean gain not above both.\n\
         - a change outside the edit scope, a commit of your own, an agent that fails or runs out of time.\n"
    );
    let _ = writeln!(
        m,
        "## Where to look\n\n\
         - `PROMPT.md`: this step's task, the champion's figures, its speed of light and bottleneck, the\n  ideas tried before (to avoid, and close enough to try again), the budget left.\n\
         - `context/history.md` (and `history.json`): every earlier attempt on this repository, with\n  its idea, verdict, reason and how the metrics moved. Do not repeat a rejected idea without a\n  reason to expect a new result.\n\
         - `context/attempts/*.patch`: the patches of the attempts worth another try (`git apply` them).\n\
         - `context/gpu.json`, `context/cases.json`, `context/champion/`: GPU facts, per-case figures and\n  bottleneck metrics, the champion's sources and parameters.\n"
    );
    let _ = writeln!(m, "## Say what you tried\n");
    let _ = writeln!(
        m,
        "End your last message with one line `IDEA: <what this edit tries, and why>` (one sentence).\n\
         It becomes this attempt's entry in the history every later step reads, beside the verdict\n\
         and how the metrics moved. Without it, the history shows only your diff's size.\n"
    );
    let _ = writeln!(m, "## Building the kernel yourself\n");
    let _ = writeln!(
        m,
        "You may compile to check your edit builds and see its registers and spills (ptxas `-v`); the\n\
         judge builds exactly so, in a cache of its own. Run from this directory, output to `$TMPDIR`:\n"
    );
    if pack.build.is_empty() {
        let _ = writeln!(m, "(no champion build is known for this space)\n");
    }
    for b in &pack.build {
        let _ = writeln!(
            m,
            "- `{}` ({}):\n\n  ```sh\n  {}\n  ```\n",
            b.variant,
            b.cases.join(", "),
            b.command
        );
    }
    let _ = writeln!(
        m,
        "Correctness and speed are the judge's to measure, on the GPU under its lock: do not time\n\
         or profile on the GPU yourself during a session (another candidate's judgement may be running).\n"
    );
    let _ = writeln!(
        m,
        "## MCP tools (`flashtune mcp`), where your client has them\n"
    );
    for (name, what) in MCP_TOOLS {
        let _ = writeln!(m, "- `{name}`: {what}");
    }
    let _ = writeln!(
        m,
        "\nIn an agent session flashtune judges your edit when you stop: read with `context`, `history`\n\
         and `attempt`, but do not call `judge` from a candidate's work directory.\n"
    );
    debug_assert!(m.len() <= AGENTS_MD_MAX_BYTES);
    m
}

/// PROMPT.md: this step's task.
pub fn prompt_md(pack: &ContextPack) -> String {
    let mut m = String::new();
    let _ = writeln!(
        m,
        "# Step {}: make HEAD's attention kernel faster\n\n\
         Edit the kernels under `{}` so that every case below runs faster than HEAD's champion\n\
         (base `{}`), and stays correct. Read `AGENTS.md` for the rules and how you are judged.\n",
        pack.step,
        pack.edit_scope,
        short(&pack.base_commit)
    );
    if let Some(g) = &pack.gpu {
        let _ = writeln!(
            m,
            "GPU: {} ({}, {} SMs, sm {}.{}){}. Measured roofs: {}; bandwidth {}.\n",
            g.name,
            g.arch,
            g.sm_count,
            g.compute_capability.0,
            g.compute_capability.1,
            if g.fake {
                " — the test double: figures are synthetic"
            } else {
                ""
            },
            if g.matmul_tflops.is_empty() {
                "matmul unknown".to_owned()
            } else {
                g.matmul_tflops
                    .iter()
                    .map(|(d, v)| format!("{d} matmul {v:.0} TFLOP/s"))
                    .collect::<Vec<_>>()
                    .join(", ")
            },
            g.bandwidth_gbps
                .map_or("unknown".into(), |b| format!("{b:.0} GB/s"))
        );
    }
    let _ = writeln!(m, "## Cases (all are judged)\n");
    let _ = writeln!(
        m,
        "| case | dtype | champion | HEAD µs | TF/s | % matmul roof | % bandwidth roof | PyTorch µs |"
    );
    let _ = writeln!(m, "|---|---|---|---:|---:|---:|---:|---:|");
    for c in &pack.cases {
        let _ = writeln!(
            m,
            "| {} | {} | `{}` | {} | {} | {} | {} | {} |",
            c.shape.label(),
            c.dtype,
            c.variant,
            c.champion_us
                .as_ref()
                .map_or("unknown".into(), |s| format!("{:.2}", s.value)),
            c.tflops.map_or("unknown".into(), |t| format!("{t:.1}")),
            pct(c.matmul_roof_fraction),
            pct(c.bandwidth_roof_fraction),
            c.pytorch_us
                .as_ref()
                .map_or("unknown".into(), |s| format!("{:.2}", s.value)),
        );
    }
    let _ = writeln!(m, "\nWhere each figure comes from:\n");
    for c in &pack.cases {
        let _ = writeln!(
            m,
            "- {} {}: HEAD {}; PyTorch {}",
            c.shape.name,
            c.dtype,
            us(c.champion_us.as_ref()),
            us(c.pytorch_us.as_ref())
        );
    }
    bottleneck_md(&mut m, pack);
    budget_md(&mut m, &pack.budget);
    ideas_md(&mut m, pack);
    m
}

/// PROMPT.md's bottleneck: per case, ncu's speed of light and the named bottleneck with its evidence.
fn bottleneck_md(m: &mut String, pack: &ContextPack) {
    let _ = writeln!(m, "\n## Speed of light and bottleneck (Nsight Compute)\n");
    let mut any = false;
    for c in &pack.cases {
        let Some(b) = &c.bottleneck else { continue };
        any = true;
        let evidence: Vec<String> = b
            .metrics
            .iter()
            .map(|(k, v)| format!("{k} = {v}"))
            .collect();
        let sol = b.speed_of_light.line();
        let _ = writeln!(
            m,
            "- {} {}: **{}**{}\n  - speed of light: {}\n  - evidence: {}\n  - from {}",
            c.shape.name,
            c.dtype,
            if b.names.is_empty() {
                "no bottleneck rule matched".to_owned()
            } else {
                b.names.join(", ")
            },
            if b.same_sources {
                ""
            } else {
                " (profiled at other kernel sources)"
            },
            if sol.is_empty() {
                "not logged".into()
            } else {
                sol
            },
            if evidence.is_empty() {
                "no metric values logged".into()
            } else {
                evidence.join(", ")
            },
            b.from
        );
        for g in &c.guided {
            let _ = writeln!(m, "  - the guided rules would try: {g}");
        }
    }
    if !any {
        let _ = writeln!(
            m,
            "No Nsight Compute profile of the champion is in the run logs (an agent session profiles it at the start; `flashtune profile` adds one)."
        );
    }
}

fn budget_md(m: &mut String, b: &BudgetLeft) {
    let _ = writeln!(m, "\n## Budget left\n");
    let _ = writeln!(
        m,
        "- steps after this one: {}; candidates this step: {}",
        b.steps_left, b.candidates
    );
    let _ = writeln!(
        m,
        "- dollars: spent {}, limit {}",
        b.spent_usd.map_or("unknown".into(), |x| format!("${x:.2}")),
        b.max_cost_usd.map_or("none".into(), |x| format!("${x:.2}"))
    );
    if let Some(t) = b.time_left_s {
        let _ = writeln!(m, "- time: {:.0} min", t / 60.0);
    }
    if let Some(p) = b.patience_left {
        let _ = writeln!(
            m,
            "- steps without an accepted edit before the session stops: {p}"
        );
    }
    if let Some(f) = b.stop_at_roof {
        let _ = writeln!(
            m,
            "- the session stops when every case reaches {:.1}% of its binding roof",
            f * 100.0
        );
    }
}

/// Words an agent (or whoever ran the judge) wrote, as they reach a later agent: on one line,
/// attributed and in quotes, never as flashtune's own statement or an instruction.
pub fn quoted(summary: &str, from: Option<&str>) -> String {
    let who = match from {
        Some("commit message") => "its commit message said",
        Some("caller") => "the judge's caller said",
        Some("diff") => "its diff reads",
        _ => "the agent said",
    };
    let one_line = summary.split_whitespace().collect::<Vec<_>>().join(" ");
    let cut: String = one_line.chars().take(IDEA_QUOTE_MAX_CHARS).collect();
    let more = if cut.len() < one_line.len() {
        "…"
    } else {
        ""
    };
    format!(
        "{who}: \"{}{more}\"",
        cut.replace('\\', "\\\\").replace('"', "\\\"")
    )
}

/// An agent's idea is quoted up to this length.
const IDEA_QUOTE_MAX_CHARS: usize = 300;

/// One attempt in PROMPT.md's lists: flashtune's facts on the first line (with the run and line of
/// the verdict), the attempt's own idea quoted below it.
pub fn note_line(n: &IdeaNote, patch: &str) -> String {
    format!(
        "`{}` {}{}{}{} — {}{patch}\n  > {}",
        n.attempt,
        n.verdict,
        n.geomean_gain
            .map_or(String::new(), |g| format!(", geomean {:+.1}%", g * 100.0)),
        n.from.as_ref().map_or(String::new(), |f| format!(" ({f})")),
        n.metrics
            .as_ref()
            .map_or(String::new(), |x| format!(" [{x}]")),
        n.reason,
        n.idea
            .as_deref()
            .map_or("(no idea summary)".to_owned(), |i| {
                quoted(i, n.idea_from.as_deref())
            })
    )
}

/// PROMPT.md's memory: the near-miss this directory starts from, what came close, what to avoid.
fn ideas_md(m: &mut String, pack: &ContextPack) {
    if let Some(n) = &pack.start_from {
        let _ = writeln!(
            m,
            "\n## Your starting point\n\nThis work directory already holds the patch of the near miss below \
             (uncommitted; `{}`). Build on it: make it beat HEAD, or take it further.\n\n- {}",
            n.pack_patch(),
            note_line(n, "")
        );
    }
    let _ = writeln!(m, "\n## Close — worth another try\n");
    if pack.worth_retrying.is_empty() {
        let _ = writeln!(m, "None yet.");
    }
    for n in &pack.worth_retrying {
        let patch = if n.patch_file.is_some() {
            format!(" (patch: `{}`)", n.pack_patch())
        } else {
            String::new()
        };
        let _ = writeln!(m, "- {}", note_line(n, &patch));
    }
    let _ = writeln!(m, "\n## Tried and failed — avoid\n");
    if pack.avoid.is_empty() {
        let _ = writeln!(m, "None yet.");
    }
    for n in &pack.avoid {
        let _ = writeln!(m, "- {}", note_line(n, ""));
    }
    let _ = writeln!(
        m,
        "\nAll {} earlier attempts are in `context/history.md`.",
        pack.history.len()
    );
}

/// history.md: one row per attempt, newest last.
pub fn history_md(history: &[HistoryEntry]) -> String {
    let mut m = String::from("# Earlier attempts on this repository\n\n");
    if history.is_empty() {
        m.push_str("None yet.\n");
        return m;
    }
    let skipped = history.len().saturating_sub(HISTORY_MD_ENTRIES);
    if skipped > 0 {
        let _ = writeln!(m, "{skipped} older attempts are in history.json only.\n");
    }
    let _ = writeln!(
        m,
        "| attempt | base | idea | diff | verdict | gain | metrics | reason | agent s | GPU s | tokens in/out | $ |"
    );
    let _ = writeln!(m, "|---|---|---|---|---|---:|---|---|---:|---:|---:|---:|");
    for h in &history[skipped..] {
        let opt = |x: Option<f64>, f: &dyn Fn(f64) -> String| x.map_or("—".into(), f);
        let _ = writeln!(
            m,
            "| `{}` | `{}` | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            h.attempt,
            short(&h.base_commit),
            h.idea
                .as_ref()
                .map_or("—".into(), |i| quoted(&i.summary, Some(&i.from))
                    .replace('|', "/")),
            h.diff_stat.clone().unwrap_or_else(|| h.files.join(" ")),
            h.verdict,
            match (h.geomean_gain, h.verdict_line) {
                (Some(g), Some(line)) => format!("{:+.1}% (line {line})", g * 100.0),
                (g, _) => opt(g, &|g| format!("{:+.1}%", g * 100.0)),
            },
            h.metrics
                .as_ref()
                .map_or("—".into(), |x| x.summary.replace('|', "/")),
            h.reason.lines().next().unwrap_or("").replace('|', "/"),
            opt(h.cost.agent_seconds, &|s| format!("{s:.0}")),
            opt(h.cost.gpu_seconds, &|s| format!("{s:.1}")),
            match (h.cost.input_tokens, h.cost.output_tokens) {
                (Some(i), Some(o)) => format!("{i}/{o}"),
                _ => "—".into(),
            },
            opt(h.cost.usd, &|u| format!("{u:.3}"))
        );
    }
    m
}

/// Write the pack into `dir`: AGENTS.md, PROMPT.md and context/. Returns the bytes written.
/// `sources` are (repository-relative path, content) of the champion's files at the base commit.
pub fn write(pack: &ContextPack, sources: &[(String, Vec<u8>)], dir: &Path) -> Result<u64> {
    let agents = agents_md(pack);
    anyhow::ensure!(
        agents.len() <= AGENTS_MD_MAX_BYTES,
        "AGENTS.md would be {} bytes, over the {AGENTS_MD_MAX_BYTES} an agent reads",
        agents.len()
    );
    let context = dir.join("context");
    std::fs::create_dir_all(context.join("champion"))
        .with_context(|| format!("cannot create {}", context.display()))?;
    let mut files: Vec<(PathBuf, Vec<u8>)> = vec![
        (dir.join("AGENTS.md"), agents.into_bytes()),
        (dir.join("PROMPT.md"), prompt_md(pack).into_bytes()),
        (
            context.join("history.md"),
            history_md(&pack.history).into_bytes(),
        ),
        (
            context.join("history.json"),
            serde_json::to_vec_pretty(&pack.history)?,
        ),
        (
            context.join("cases.json"),
            serde_json::to_vec_pretty(&pack.cases)?,
        ),
        (
            context.join("gpu.json"),
            serde_json::to_vec_pretty(&pack.gpu)?,
        ),
        (
            context.join("budget.json"),
            serde_json::to_vec_pretty(&pack.budget)?,
        ),
        (
            context.join("ideas.json"),
            serde_json::to_vec_pretty(&serde_json::json!({
                "start_from": pack.start_from,
                "worth_retrying": pack.worth_retrying,
                "avoid": pack.avoid,
            }))?,
        ),
    ];
    let mut total: u64 = files.iter().map(|(_, b)| b.len() as u64).sum();
    // The patches worth another try, whole, as their run folders keep them.
    for note in pack.start_from.iter().chain(&pack.worth_retrying) {
        let Some(patch) = note.patch_file.as_ref().and_then(|p| std::fs::read(p).ok()) else {
            continue;
        };
        let path = dir.join(note.pack_patch());
        if total + patch.len() as u64 > PACK_MAX_BYTES || files.iter().any(|(p, _)| *p == path) {
            continue;
        }
        total += patch.len() as u64;
        files.push((path, patch));
    }
    let mut left_out = Vec::new();
    for (rel, content) in sources {
        if total + content.len() as u64 > PACK_MAX_BYTES {
            left_out.push(rel.clone());
            continue;
        }
        total += content.len() as u64;
        files.push((context.join("champion").join(rel), content.clone()));
    }
    let params: BTreeMap<String, &BTreeMap<String, String>> = pack
        .cases
        .iter()
        .map(|c| (format!("{} {}", c.shape.name, c.dtype), &c.params))
        .collect();
    let champion = serde_json::json!({
        "variants": pack.cases.iter().map(|c| (format!("{} {}", c.shape.name, c.dtype), c.variant.clone())).collect::<BTreeMap<_, _>>(),
        "params": params,
        "sources": pack.sources,
        "sources_left_out_for_size": left_out,
    });
    files.push((
        context.join("champion.json"),
        serde_json::to_vec_pretty(&champion)?,
    ));
    let mut written = 0;
    for (path, bytes) in files {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        std::fs::write(&path, &bytes)
            .with_context(|| format!("cannot write {}", path.display()))?;
        written += bytes.len() as u64;
    }
    Ok(written)
}

/// Paths (relative to a work directory) the pack writes: not part of any candidate's edit.
pub fn is_pack_path(rel: &str) -> bool {
    rel == "AGENTS.md" || rel == "PROMPT.md" || rel == "context" || rel.starts_with("context/")
}

pub(super) fn short(commit: &str) -> &str {
    &commit[..commit.len().min(10)]
}
