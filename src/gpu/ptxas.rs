//! Parses `nvcc -Xptxas -v` reports into per-entry-function resource usage.
use serde::{Deserialize, Serialize};

/// What ptxas says one entry function uses.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryResources {
    /// The symbol name as ptxas prints it (mangled for C++ names).
    pub name: String,
    pub arch: String,
    pub registers: u32,
    pub barriers: u32,
    pub stack_frame_bytes: u32,
    pub spill_store_bytes: u32,
    pub spill_load_bytes: u32,
    /// Static shared memory only; dynamic shared memory is the launch's business.
    pub static_smem_bytes: u32,
    /// Set when ptxas overrode the register limit (`-maxrregcount`).
    pub max_registers_override: Option<u32>,
}

impl EntryResources {
    pub fn spill_bytes(&self) -> u64 {
        self.spill_store_bytes as u64 + self.spill_load_bytes as u64
    }
}

/// Parse a whole ptxas report. Lines that belong to no entry (gmem totals, compile time) are ignored.
pub fn parse(report: &str) -> Vec<EntryResources> {
    let mut entries: Vec<EntryResources> = Vec::new();
    let mut overrides: Vec<(String, u32)> = Vec::new();
    // Properties lines name their function; "Used ..." lines follow the function they describe.
    let mut current: Option<usize> = None;
    for raw in report.lines() {
        let line = raw.trim();
        let info = line
            .strip_prefix("ptxas info")
            .map(|rest| rest.trim_start().trim_start_matches(':').trim());
        if let Some(info) = info {
            if let Some(rest) = info.strip_prefix("Compiling entry function ") {
                let name = quoted(rest).unwrap_or_default();
                let arch = rest
                    .split(" for ")
                    .nth(1)
                    .and_then(quoted)
                    .unwrap_or_default();
                current = Some(index_of(&mut entries, &name));
                entries[current.unwrap()].arch = arch;
            } else if let Some(rest) = info.strip_prefix("Function properties for ") {
                let name = rest.trim().to_owned();
                // Device (non-entry) functions also get properties; only entries are tracked.
                current = entries.iter().position(|e| e.name == name);
            } else if let Some(rest) = info.strip_prefix("Used ") {
                if let Some(i) = current {
                    apply_usage(&mut entries[i], rest);
                }
            } else if let Some(rest) = info.strip_prefix("Overriding maximum register limit ") {
                // "256 for 'name' with  32 of maxrregcount option"
                if let (Some(name), Some(limit)) = (
                    quoted(rest),
                    rest.split(" with ").nth(1).and_then(first_number),
                ) {
                    overrides.push((name, limit));
                }
            }
        } else if line.contains("bytes stack frame") {
            if let Some(i) = current {
                apply_frame(&mut entries[i], line);
            }
        }
    }
    for (name, limit) in overrides {
        if let Some(e) = entries.iter_mut().find(|e| e.name == name) {
            e.max_registers_override = Some(limit);
        }
    }
    entries
}

fn index_of(entries: &mut Vec<EntryResources>, name: &str) -> usize {
    if let Some(i) = entries.iter().position(|e| e.name == name) {
        return i;
    }
    entries.push(EntryResources {
        name: name.to_owned(),
        ..Default::default()
    });
    entries.len() - 1
}

/// "Used 31 registers, used 1 barriers, 1056 bytes cumulative stack size, 4096 bytes smem"
fn apply_usage(e: &mut EntryResources, rest: &str) {
    for part in rest.split(',') {
        let part = part.trim();
        let n = first_number(part).unwrap_or(0);
        if part.ends_with("registers") {
            e.registers = n;
        } else if part.ends_with("barriers") {
            e.barriers = n;
        } else if part.ends_with("bytes smem") {
            e.static_smem_bytes = n;
        }
    }
}

/// "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads"
fn apply_frame(e: &mut EntryResources, line: &str) {
    for part in line.split(',') {
        let part = part.trim();
        let n = first_number(part).unwrap_or(0);
        if part.ends_with("stack frame") {
            e.stack_frame_bytes = n;
        } else if part.ends_with("spill stores") {
            e.spill_store_bytes = n;
        } else if part.ends_with("spill loads") {
            e.spill_load_bytes = n;
        }
    }
}

fn quoted(s: &str) -> Option<String> {
    let start = s.find('\'')? + 1;
    let len = s[start..].find('\'')?;
    Some(s[start..start + len].to_owned())
}

fn first_number(s: &str) -> Option<u32> {
    s.split(|c: char| !c.is_ascii_digit())
        .find(|t| !t.is_empty())?
        .parse()
        .ok()
}
