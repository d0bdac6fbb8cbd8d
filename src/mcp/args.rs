//! Each tool's arguments, and the check a call passes before it runs: a known tool, known arguments of the right types, a `wait_s` within bounds.
use super::{Workbench, MAX_WAIT_S};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::schemars::{self, JsonSchema};
use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Debug, Deserialize, JsonSchema)]
pub struct JudgeArgs {
    /// Variant space whose shapes are the cases judged, relative to the project root (default:
    /// policies.toml's default_space). Must lie inside the project.
    #[serde(default)]
    pub space: Option<String>,
    /// The champion variant where HEAD's champion table names none (an id of the space, e.g.
    /// `scalar-bm64-bn64-w4-ks1-s1`).
    #[serde(default)]
    pub variant: Option<String>,
    /// Seconds to wait for the verdict before returning the job id to poll (default 45, at most 540).
    #[serde(default)]
    #[schemars(range(max = MAX_WAIT_S))]
    pub wait_s: Option<u64>,
    /// What the edit tries, in one sentence: its entry in the history every later attempt reads.
    #[serde(default)]
    pub idea: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct StatusArgs {
    /// The job id `judge` or `profile` returned (e.g. `judge-1`).
    pub job: String,
    /// Seconds to wait for the job to end before answering "running" again (default 45, at most 540).
    #[serde(default)]
    #[schemars(range(max = MAX_WAIT_S))]
    pub wait_s: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ProfileArgs {
    /// Variant id as the run logged it (e.g. `mma-bm128-bn64-w4-auto-s2`).
    pub variant: String,
    /// Shape name from policies.toml (e.g. `small`).
    pub shape: String,
    /// `f16` or `bf16` (default f16).
    #[serde(default)]
    pub dtype: Option<String>,
    /// The run the variant was built and timed in: its id or folder under runs/ (default: the
    /// newest run that timed the variant).
    #[serde(default)]
    pub run: Option<String>,
    /// Seconds to wait before returning the job id to poll (default 45, at most 540).
    #[serde(default)]
    #[schemars(range(max = MAX_WAIT_S))]
    pub wait_s: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct HistoryArgs {
    /// How many of the most recent steps to return (default 20).
    #[serde(default)]
    pub last: Option<usize>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct ContextArgs {
    /// Variant space to describe (default: policies.toml's default_space).
    #[serde(default)]
    pub space: Option<String>,
    /// The champion variant where HEAD's champion table names none.
    #[serde(default)]
    pub variant: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub struct AttemptArgs {
    /// The attempt id `history` lists: `<run id>/<step>` or `<run id>/<step>.<candidate>`.
    pub id: String,
}

/// A call checked before it runs: an unknown tool, an unknown argument, an argument of the wrong type
/// or a `wait_s` above [`MAX_WAIT_S`] is a JSON-RPC invalid-params error (-32602) whose `data` is the
/// error document (`unknown_tool` with the known tools; `bad_argument` with the field), rather than
/// rmcp's bare "tool not found" or an argument silently ignored or cut down.
pub(super) fn check_call(
    router: &ToolRouter<Workbench>,
    tool: &str,
    arguments: Option<&serde_json::Map<String, Value>>,
) -> std::result::Result<(), rmcp::ErrorData> {
    let refuse = |code: &str, message: String, extra: Value| {
        rmcp::ErrorData::invalid_params(
            message.clone(),
            Some(crate::agent::error_document(code, &message, extra)),
        )
    };
    let Some(schema) = router.get(tool) else {
        let mut known: Vec<String> = router
            .list_all()
            .into_iter()
            .map(|t| t.name.to_string())
            .collect();
        known.sort();
        return Err(refuse(
            "unknown_tool",
            format!("no tool `{tool}`; the tools are {}", known.join(", ")),
            json!({ "tool": tool, "known": known }),
        ));
    };
    let given = arguments.cloned().unwrap_or_default();
    let accepted: Vec<String> = schema
        .input_schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default();
    let unknown: Vec<String> = given
        .keys()
        .filter(|k| !accepted.contains(k))
        .cloned()
        .collect();
    if !unknown.is_empty() {
        let quoted = |names: &[String]| {
            names
                .iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        return Err(refuse(
            "bad_argument",
            format!(
                "unknown argument{} {} to `{tool}`; it takes {}",
                if unknown.len() == 1 { "" } else { "s" },
                quoted(&unknown),
                if accepted.is_empty() {
                    "none".to_owned()
                } else {
                    quoted(&accepted)
                }
            ),
            json!({ "tool": tool, "field": unknown[0], "unknown": unknown, "accepted": accepted }),
        ));
    }
    check_arguments(tool, &given)?;
    if let Some(wait) = given.get("wait_s").and_then(Value::as_u64) {
        if wait > MAX_WAIT_S {
            return Err(refuse(
                "bad_argument",
                format!(
                    "`wait_s` {wait} to `{tool}` is above the maximum, {MAX_WAIT_S} s; wait at most {MAX_WAIT_S} s and poll with judge_status"
                ),
                json!({ "tool": tool, "field": "wait_s", "maximum": MAX_WAIT_S }),
            ));
        }
    }
    Ok(())
}

/// Each tool's arguments checked against its type before the call, so a wrong type is a JSON-RPC
/// invalid-params error with a structured `data` rather than rmcp's plain-text tool error.
fn check_arguments(
    tool: &str,
    given: &serde_json::Map<String, Value>,
) -> std::result::Result<(), rmcp::ErrorData> {
    fn parse<T: serde::de::DeserializeOwned>(v: Value) -> std::result::Result<(), String> {
        serde_json::from_value::<T>(v)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
    let check = |args: &serde_json::Map<String, Value>| {
        let args = Value::Object(args.clone());
        match tool {
            "judge" => parse::<JudgeArgs>(args),
            "judge_status" => parse::<StatusArgs>(args),
            "profile" => parse::<ProfileArgs>(args),
            "history" => parse::<HistoryArgs>(args),
            "context" => parse::<ContextArgs>(args),
            "attempt" => parse::<AttemptArgs>(args),
            _ => Ok(()),
        }
    };
    let Err(why) = check(given) else {
        return Ok(());
    };
    // serde names a missing field but not a mistyped one: the argument whose removal cures it is.
    let field = given.keys().find(|k| {
        let mut without = given.clone();
        without.remove(*k);
        check(&without).is_ok()
    });
    let message = match field {
        Some(f) => format!("bad argument `{f}` to `{tool}`: {why}"),
        None => format!("bad arguments to `{tool}`: {why}"),
    };
    Err(rmcp::ErrorData::invalid_params(
        message.clone(),
        Some(crate::agent::error_document(
            "bad_argument",
            &message,
            json!({ "tool": tool, "field": field }),
        )),
    ))
}
