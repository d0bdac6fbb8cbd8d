//! The module layering, at two scales. Folders: `crate::` imports between the folders of `src/` (and
//! its top-level files) form no cycle and point from a higher layer to a lower (or the same) one.
//! Rooms: inside the layer folders, whose `mod.rs` only declares, each file or subfolder is a room,
//! and the imports between all rooms form no cycle either. ARCHITECTURE.md holds both graphs;
//! `cargo test --test it layering:: -- --nocapture` prints them.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The folders (and top-level files) of `src/`, lowest first; one may import from its own layer
/// (if that makes no cycle) or any below.
const LAYERS: &[(&str, &[&str])] = &[
    ("leaves", &["error", "os"]),
    ("vocabulary", &["model"]),
    ("gpu and checks", &["gpu"]),
    ("the log", &["log"]),
    ("reading the log", &["report", "pack"]),
    ("running", &["run"]),
    ("edits", &["step", "agent"]),
    ("commands", &["cli", "mcp"]),
];

/// Folders whose `mod.rs` only declares their rooms: each room is a node of the room graph. Any
/// other folder is one room (its files share one `mod.rs` that holds code).
const LAYER_FOLDERS: &[&str] = &["os", "model", "gpu", "log", "report", "run"];

/// The crate roots only declare and re-export modules; they are not layered.
const ROOTS: &[&str] = &["lib", "main"];

const GRAPH_BEGIN: &str = "<!-- import graph: begin -->";
const GRAPH_END: &str = "<!-- import graph: end -->";

type Graph = BTreeMap<String, BTreeSet<String>>;

pub(crate) fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
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

/// The room a file belongs to: `src/error.rs` is `error`, `src/gpu/trial/verify.rs` is
/// `gpu::trial`, `src/step/judge.rs` is `step`.
fn room_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).expect("file under src/");
    let names: Vec<String> = rel
        .components()
        .map(|c| {
            let name = c.as_os_str().to_string_lossy();
            name.strip_suffix(".rs").unwrap_or(&name).to_owned()
        })
        .collect();
    match names.as_slice() {
        [folder, room, ..] if LAYER_FOLDERS.contains(&folder.as_str()) && room != "mod" => {
            format!("{folder}::{room}")
        }
        [first, ..] => first.clone(),
        [] => unreachable!("non-empty path"),
    }
}

fn folder_of(room: &str) -> &str {
    room.split("::").next().expect("non-empty room")
}

/// Test code may reach anywhere; only what ships counts, so a file is read up to its first `#[cfg(test)]`.
pub(crate) fn shipped_part(text: &str) -> &str {
    text.find("#[cfg(test)]").map_or(text, |i| &text[..i])
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The paths (up to two names) that `text` reaches as `crate::…` (not `foocrate::`), with use-groups
/// opened: `crate::gpu::{trial::X, worker}` reaches `gpu::trial` and `gpu::worker`.
fn crate_paths(text: &str) -> BTreeSet<Vec<String>> {
    fn ident_at(s: &str) -> String {
        s.trim_start()
            .chars()
            .take_while(|&c| is_ident(c))
            .collect()
    }
    /// The top-level items of the group that opens at `s[0] == '{'`.
    fn group_items(s: &str) -> Vec<&str> {
        let (mut depth, mut from, mut items) = (0usize, 1usize, Vec::new());
        for (i, c) in s.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        items.push(&s[from..i]);
                        break;
                    }
                }
                ',' if depth == 1 => {
                    items.push(&s[from..i]);
                    from = i + 1;
                }
                _ => {}
            }
        }
        items
    }
    fn expand(prefix: Vec<String>, s: &str, out: &mut BTreeSet<Vec<String>>) {
        let s = s.trim_start();
        if prefix.len() == 2 {
            out.insert(prefix);
            return;
        }
        if s.starts_with('{') {
            for item in group_items(s) {
                expand(prefix.clone(), item, out);
            }
            return;
        }
        let name = ident_at(s);
        if name.is_empty() || name == "self" {
            if !prefix.is_empty() {
                out.insert(prefix);
            }
            return;
        }
        let after = &s.trim_start()[name.len()..];
        // `crate::say!`: a macro the crate exports at its root, no module.
        if prefix.is_empty() && after.starts_with('!') {
            return;
        }
        let mut path = prefix;
        path.push(name);
        match after.strip_prefix("::") {
            Some(more) => expand(path, more, out),
            None => {
                out.insert(path);
            }
        }
    }
    let mut out = BTreeSet::new();
    for (i, m) in text.match_indices("crate::") {
        if text[..i].chars().next_back().is_some_and(is_ident) {
            continue;
        }
        expand(Vec::new(), &text[i + m.len()..], &mut out);
    }
    out
}

/// The room a `crate::` path lands in: `[gpu, trial]` is `gpu::trial` where gpu is a layer folder
/// with that room, `[step, Step]` is `step`.
fn room_of_path(src: &Path, path: &[String]) -> String {
    let folder = &path[0];
    match path.get(1) {
        Some(room)
            if LAYER_FOLDERS.contains(&folder.as_str())
                && (src.join(folder).join(format!("{room}.rs")).is_file()
                    || src.join(folder).join(room).is_dir()) =>
        {
            format!("{folder}::{room}")
        }
        _ => folder.clone(),
    }
}

/// Room -> the rooms it imports.
fn scan(src: &Path) -> Graph {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut graph = Graph::new();
    for file in files {
        let room = room_of(src, &file);
        if ROOTS.contains(&room.as_str()) {
            continue;
        }
        let text = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", file.display()));
        let deps = graph.entry(room.clone()).or_default();
        for path in crate_paths(shipped_part(&text)) {
            let dep = room_of_path(src, &path);
            if dep != room && dep != folder_of(&room) {
                deps.insert(dep);
            }
        }
    }
    graph.retain(|room, _| LAYER_FOLDERS.contains(&folder_of(room)) || !room.contains("::"));
    graph
}

/// The room graph folded to folders: `gpu::trial -> model::config` becomes `gpu -> model`.
fn folders(rooms: &Graph) -> Graph {
    let mut graph = Graph::new();
    for (room, deps) in rooms {
        let from = folder_of(room).to_owned();
        let entry = graph.entry(from.clone()).or_default();
        for dep in deps {
            let to = folder_of(dep);
            if to != from {
                entry.insert(to.to_owned());
            }
        }
    }
    graph
}

pub(crate) fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn project_rooms() -> Graph {
    scan(&src_dir())
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
fn folders_import_no_cycle() {
    if let Err(e) = check_acyclic(&folders(&project_rooms())) {
        panic!("{e}");
    }
}

#[test]
fn rooms_import_no_cycle() {
    if let Err(e) = check_acyclic(&project_rooms()) {
        panic!("{e}");
    }
}

#[test]
fn folders_import_down_the_layers() {
    if let Err(e) = check_layered(&folders(&project_rooms()), LAYERS) {
        panic!("{e}");
    }
}

#[test]
fn every_folder_is_placed_once() {
    let mut seen = BTreeSet::new();
    for (_, modules) in LAYERS {
        for m in *modules {
            assert!(seen.insert(*m), "`{m}` is in LAYERS twice");
        }
    }
    let graph = folders(&project_rooms());
    for m in &seen {
        assert!(
            graph.contains_key(*m),
            "LAYERS names `{m}`, which src/ does not have"
        );
    }
}

/// A layer folder's `mod.rs` declares its rooms and says what the folder is for; code lives in the
/// rooms, so the room graph sees every import.
#[test]
fn layer_folders_only_declare_their_rooms() {
    for folder in LAYER_FOLDERS {
        let path = src_dir().join(folder).join("mod.rs");
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for line in text.lines() {
            assert!(
                line.starts_with("//!") || line.starts_with("pub mod ") || line.trim().is_empty(),
                "{} holds more than declarations: {line}",
                path.display()
            );
        }
    }
}

/// At most 12 `.rs` files sit directly in `src/`: the rest live in the folders of their layer.
#[test]
fn few_files_sit_directly_in_src() {
    let top: Vec<String> = std::fs::read_dir(src_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .map(|p| p.display().to_string())
        .collect();
    assert!(
        top.len() <= 12,
        "{} files directly in src/: {top:?}",
        top.len()
    );
}

/// Lines outside a file's `#[cfg(test)] mod … { … }` blocks (or `#[cfg(test)] mod …;` lines).
fn shipped_lines(text: &str) -> usize {
    let lines: Vec<&str> = text.lines().collect();
    let (mut count, mut i) = (0, 0);
    while i < lines.len() {
        if lines[i].trim() == "#[cfg(test)]" {
            let mut j = i + 1;
            while j < lines.len() && lines[j].starts_with("#[") {
                j += 1;
            }
            if let Some(decl) = lines.get(j).filter(|l| l.starts_with("mod ")) {
                if decl.trim_end().ends_with(';') {
                    i = j + 1;
                    continue;
                }
                if decl.trim_end().ends_with('{') {
                    // The block ends at the first closing brace in column 0 (rustfmt's layout).
                    let end = (j + 1..lines.len())
                        .find(|&k| lines[k] == "}")
                        .unwrap_or(lines.len());
                    i = end + 1;
                    continue;
                }
            }
        }
        count += 1;
        i += 1;
    }
    count
}

/// Architecture Invariant: no file has more than 800 lines outside its tests; a bigger one is
/// split along its seams into rooms of one job each.
#[test]
fn no_file_has_more_than_800_lines_outside_its_tests() {
    let mut files = Vec::new();
    rust_files(&src_dir(), &mut files);
    let big: Vec<String> = files
        .iter()
        .map(|f| (shipped_lines(&std::fs::read_to_string(f).unwrap()), f))
        .filter(|(n, _)| *n > 800)
        .map(|(n, f)| format!("{} ({n} lines)", f.display()))
        .collect();
    assert!(
        big.is_empty(),
        "files over 800 lines outside their tests: {big:?}"
    );
}

#[test]
fn the_line_count_leaves_out_test_modules_only() {
    let text = "fn a() {}\n#[cfg(test)]\nfn helper() {}\n#[cfg(test)]\nmod tests {\n    fn t() {}\n}\nfn b() {}\n#[cfg(test)]\nmod more;\n";
    // a, the attribute and helper (test-only code outside a test module still counts), b.
    assert_eq!(shipped_lines(text), 4);
}

#[test]
fn architecture_md_lists_the_current_graph() {
    let rooms = project_rooms();
    let graph = format!(
        "{}{}",
        render(&folders(&rooms)),
        render(&rooms_only(&rooms))
    );
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

/// The rooms inside layer folders (the folder lines already say where single-room folders point).
fn rooms_only(rooms: &Graph) -> Graph {
    rooms
        .iter()
        .filter(|(room, _)| room.contains("::"))
        .map(|(room, deps)| (room.clone(), deps.clone()))
        .collect()
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
    let text = "use crate::model::config::Dtype;\nfn f() { crate::model::space::x(); notcrate::run::y(); }\n\
                #[cfg(test)]\nmod tests { use crate::run::engine::Project; }\n";
    let paths = crate_paths(shipped_part(text));
    let names: BTreeSet<String> = paths.iter().map(|p| p.join("::")).collect();
    let expected: BTreeSet<String> = ["model::config", "model::space"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(names, expected);
}

#[test]
fn the_scanner_opens_use_groups() {
    let text = "use crate::{error::Result, gpu::{trial::{self, Round}, worker}};\nuse crate::step::Step;\n\
                use crate::log::{self, runlog};\n";
    let names: BTreeSet<String> = crate_paths(text).iter().map(|p| p.join("::")).collect();
    let expected: BTreeSet<String> = [
        "error::Result",
        "gpu::trial",
        "gpu::worker",
        "step::Step",
        "log",
        "log::runlog",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(names, expected);
    let src = src_dir();
    let rooms: BTreeSet<String> = crate_paths(text)
        .iter()
        .map(|p| room_of_path(&src, p))
        .collect();
    let expected: BTreeSet<String> = [
        "error",
        "gpu::trial",
        "gpu::worker",
        "step",
        "log",
        "log::runlog",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(rooms, expected);
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
        .filter(|f| room_of(&src, f) != "gpu::worker")
        .filter(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            text.contains("cudarc") || text.contains("cuMem") || text.contains("cuLaunch")
        })
        .map(|f| f.display().to_string())
        .collect();
    assert!(touching.is_empty(), "CUDA outside the worker: {touching:?}");
}
