//! The module layering: `crate::` imports between top-level modules form no cycle, and point from a higher layer to a lower (or the same) one. ARCHITECTURE.md holds the same graph; `cargo test --test it layering:: -- --nocapture` prints it.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Lowest first; a module may import from its own layer (if that makes no cycle) or any below.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "leaves",
        &[
            "error",
            "ptxas",
            "vcs",
            "stop",
            "trusted",
            "toolchain",
            "gpulock",
            "seal",
        ],
    ),
    (
        "vocabulary",
        &["vocab", "usage", "config", "space", "protocol", "plan"],
    ),
    (
        "gpu and checks",
        &[
            "check", "decide", "build", "profile", "trial", "worker", "fakegpu", "slurm",
            "executor", "baseline",
        ],
    ),
    ("the log", &["runlog"]),
    (
        "reading the log",
        &[
            "runindex",
            "findings",
            "plots",
            "report",
            "html",
            "export",
            "champions",
            "roofs",
            "store",
            "pack",
        ],
    ),
    (
        "running",
        &[
            "run",
            "sandbox",
            "duel",
            "scheduler",
            "anytime",
            "measure",
            "search",
            "ablate",
            "step",
            "engine",
            "agent",
        ],
    ),
    ("commands", &["cli", "progress", "doctor", "mcp"]),
];

/// The crate roots only declare and re-export modules; they are not layered.
const ROOTS: &[&str] = &["lib", "main"];

const GRAPH_BEGIN: &str = "<!-- import graph: begin -->";
const GRAPH_END: &str = "<!-- import graph: end -->";

type Graph = BTreeMap<String, BTreeSet<String>>;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a file belongs to: `src/run.rs` is `run`, `src/worker/nvml.rs` is `worker`.
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).expect("file under src/");
    let first = rel.components().next().expect("non-empty path");
    let name = first.as_os_str().to_string_lossy();
    name.strip_suffix(".rs").unwrap_or(&name).to_owned()
}

/// Test code may reach anywhere; only what ships counts, so a file is read up to its first `#[cfg(test)]`.
fn shipped_part(text: &str) -> &str {
    text.find("#[cfg(test)]").map_or(text, |i| &text[..i])
}

/// The modules named as `crate::<module>` in `text` (not `foocrate::`).
fn crate_references(text: &str) -> BTreeSet<String> {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices("crate::")
        .filter(|(i, _)| !text[..*i].chars().next_back().is_some_and(ident))
        .map(|(i, m)| {
            text[i + m.len()..]
                .chars()
                .take_while(|&c| ident(c))
                .collect::<String>()
        })
        .filter(|name| !name.is_empty())
        .collect()
}

fn scan(src: &Path) -> Graph {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut graph = Graph::new();
    for file in files {
        let module = module_of(src, &file);
        if ROOTS.contains(&module.as_str()) {
            continue;
        }
        let text = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", file.display()));
        let deps = graph.entry(module.clone()).or_default();
        for dep in crate_references(shipped_part(&text)) {
            if dep != module {
                deps.insert(dep);
            }
        }
    }
    graph
}

fn project_graph() -> Graph {
    scan(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
}

/// A cycle as `a -> b -> ... -> a`, if the graph has one.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        node: &str,
        graph: &Graph,
        marks: &mut BTreeMap<String, Mark>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match marks.get(node) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let start = path
                    .iter()
                    .position(|p| p == node)
                    .expect("open node on path");
                let mut cycle = path[start..].to_vec();
                cycle.push(node.to_owned());
                return Some(cycle);
            }
            None => {}
        }
        marks.insert(node.to_owned(), Mark::Open);
        path.push(node.to_owned());
        for dep in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(dep, graph, marks, path) {
                return Some(cycle);
            }
        }
        path.pop();
        marks.insert(node.to_owned(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for node in graph.keys() {
        let mut path = Vec::new();
        if let Some(cycle) = visit(node, graph, &mut marks, &mut path) {
            return Some(cycle);
        }
    }
    None
}

fn layer_of(layers: &[(&str, &[&str])], module: &str) -> Option<usize> {
    layers.iter().position(|(_, ms)| ms.contains(&module))
}

/// Every edge that climbs to a higher layer, and every module the table does not place.
fn layering_faults(graph: &Graph, layers: &[(&str, &[&str])]) -> Vec<String> {
    let mut faults = Vec::new();
    let modules: BTreeSet<&String> = graph.keys().chain(graph.values().flatten()).collect();
    for m in modules {
        if layer_of(layers, m).is_none() {
            faults.push(format!("`{m}` has no layer in LAYERS"));
        }
    }
    for (from, deps) in graph {
        let Some(lf) = layer_of(layers, from) else {
            continue;
        };
        for to in deps {
            match layer_of(layers, to) {
                Some(lt) if lt > lf => faults.push(format!(
                    "{from} ({}) -> {to} ({}): imports a higher layer",
                    layers[lf].0, layers[lt].0
                )),
                _ => {}
            }
        }
    }
    faults
}

/// One `module -> deps` line per module, as ARCHITECTURE.md lists them.
fn render(graph: &Graph) -> String {
    graph
        .iter()
        .map(|(m, deps)| {
            let deps: Vec<&str> = deps.iter().map(String::as_str).collect();
            if deps.is_empty() {
                format!("{m} -> (nothing)\n")
            } else {
                format!("{m} -> {}\n", deps.join(" "))
            }
        })
        .collect()
}

fn check_acyclic(graph: &Graph) -> Result<(), String> {
    match find_cycle(graph) {
        Some(cycle) => Err(format!("import cycle: {}", cycle.join(" -> "))),
        None => Ok(()),
    }
}

fn check_layered(graph: &Graph, layers: &[(&str, &[&str])]) -> Result<(), String> {
    let faults = layering_faults(graph, layers);
    if faults.is_empty() {
        Ok(())
    } else {
        Err(format!("layering faults:\n{}", faults.join("\n")))
    }
}

#[test]
fn imports_have_no_cycle() {
    if let Err(e) = check_acyclic(&project_graph()) {
        panic!("{e}");
    }
}

#[test]
fn imports_point_down_the_layers() {
    if let Err(e) = check_layered(&project_graph(), LAYERS) {
        panic!("{e}");
    }
}

#[test]
fn every_module_is_placed_once() {
    let mut seen = BTreeSet::new();
    for (_, modules) in LAYERS {
        for m in *modules {
            assert!(seen.insert(*m), "`{m}` is in LAYERS twice");
        }
    }
    let graph = project_graph();
    for m in &seen {
        assert!(
            graph.contains_key(*m),
            "LAYERS names `{m}`, which src/ does not have"
        );
    }
}

#[test]
fn architecture_md_lists_the_current_graph() {
    let graph = render(&project_graph());
    println!("{graph}");
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("ARCHITECTURE.md");
    let doc = std::fs::read_to_string(&path).expect("ARCHITECTURE.md");
    let begin = doc.find(GRAPH_BEGIN).expect("graph begin marker") + GRAPH_BEGIN.len();
    let end = doc.find(GRAPH_END).expect("graph end marker");
    let listed: String = doc[begin..end]
        .lines()
        .filter(|l| l.contains(" -> "))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(
        listed, graph,
        "ARCHITECTURE.md's import graph is stale; put the lines printed above between its markers"
    );
}

fn graph_of(edges: &[(&str, &[&str])]) -> Graph {
    edges
        .iter()
        .map(|(m, deps)| (m.to_string(), deps.iter().map(|d| d.to_string()).collect()))
        .collect()
}

#[test]
fn the_checker_finds_a_cycle() {
    let graph = graph_of(&[("a", &["b"]), ("b", &["c"]), ("c", &["a"]), ("d", &["a"])]);
    let cycle = find_cycle(&graph).expect("a cycle");
    assert_eq!(cycle.first(), cycle.last());
    assert_eq!(cycle.len(), 4, "{cycle:?}");
    let err = check_acyclic(&graph).unwrap_err();
    assert!(err.contains("a -> b -> c -> a"), "{err}");
    assert!(find_cycle(&graph_of(&[("a", &["b"]), ("b", &[]), ("c", &["a", "b"])])).is_none());
}

#[test]
fn the_checker_finds_an_upward_edge_and_an_unplaced_module() {
    let layers: &[(&str, &[&str])] = &[("low", &["a"]), ("high", &["b"])];
    let down = graph_of(&[("b", &["a"]), ("a", &[])]);
    assert!(layering_faults(&down, layers).is_empty());
    let up = graph_of(&[("a", &["b"]), ("b", &[])]);
    let faults = layering_faults(&up, layers);
    assert_eq!(faults.len(), 1, "{faults:?}");
    assert!(faults[0].starts_with("a (low) -> b (high)"), "{faults:?}");
    assert!(check_layered(&up, layers).is_err());
    assert!(check_layered(&down, layers).is_ok());
    let stray = graph_of(&[("b", &["z"])]);
    assert!(layering_faults(&stray, layers)[0].contains("`z` has no layer"));
}

#[test]
fn the_scanner_reads_shipped_code_only() {
    let text = "use crate::config::Dtype;\nfn f() { crate::space::x(); notcrate::run::y(); }\n\
                #[cfg(test)]\nmod tests { use crate::engine::Project; }\n";
    let refs = crate_references(shipped_part(text));
    let expected: BTreeSet<String> = ["config", "space"].iter().map(|s| s.to_string()).collect();
    assert_eq!(refs, expected);
}

/// Architecture Invariant: only the worker touches the GPU. No module but `worker` names cudarc (or
/// the CUDA driver), so nothing else can allocate, launch or read device memory.
#[test]
fn only_the_worker_names_the_cuda_driver() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let touching: Vec<String> = files
        .iter()
        .filter(|f| module_of(&src, f) != "worker")
        .filter(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            text.contains("cudarc") || text.contains("cuMem") || text.contains("cuLaunch")
        })
        .map(|f| f.display().to_string())
        .collect();
    assert!(touching.is_empty(), "CUDA outside the worker: {touching:?}");
}
