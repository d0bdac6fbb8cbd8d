//! What one agent run cost: tokens and dollars read from the agent CLI's own output (Claude Code, Codex, Gemini CLI, aider) or from the file a wrapper writes, priced by policies.toml where the agent names no dollars.
//!
//! Each adapter reads the fields its CLI documents (see tests/fixtures/agents/SOURCE.md); a field
//! that is absent stays unknown, never zero, so the ledger's dollars are null rather than wrong.
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// How an agent's usage is read: which output, in which CLI's format.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum UsageFormat {
    /// Claude Code's `--output-format json` result on stdout: `total_cost_usd`, `modelUsage`.
    Claude,
    /// Codex's `exec --json` events on stdout: the `turn.completed` events' `usage`.
    Codex,
    /// Gemini CLI's `-o json` result on stdout: `stats.models.<model>.tokens`.
    Gemini,
    /// aider's `--analytics-log` JSON lines in the usage file: `message_send` events.
    Aider,
    /// flashtune's own format in `$FLASHTUNE_USAGE_FILE`, written by a wrapper (see [`WrapperUsage`]).
    File,
}

impl std::fmt::Display for UsageFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(match self {
            UsageFormat::Claude => "claude",
            UsageFormat::Codex => "codex",
            UsageFormat::Gemini => "gemini",
            UsageFormat::Aider => "aider",
            UsageFormat::File => "file",
        })
    }
}

/// Tokens of one model in one agent run.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ModelTokens {
    pub model: String,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Input tokens read from the provider's prompt cache (billed lower).
    #[serde(default)]
    pub cached_input_tokens: u64,
    /// Input tokens written to the prompt cache (Claude bills them higher).
    #[serde(default)]
    pub cache_write_tokens: u64,
    /// Thinking or reasoning tokens, where the CLI counts them apart (already inside output on Codex).
    #[serde(default)]
    pub reasoning_tokens: u64,
    /// Dollars the agent itself reported for this model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usd: Option<f64>,
}

/// One candidate's agent usage as the ledger records it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Usage {
    /// The adapter that read it.
    pub source: String,
    pub models: Vec<ModelTokens>,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cached_input_tokens: u64,
    /// Dollars: the agent's own figure, else the price table's; null when neither knows.
    pub usd: Option<f64>,
    /// `agent` or `price table`; null with `usd`.
    pub usd_from: Option<String>,
}

/// The format a wrapper writes to `$FLASHTUNE_USAGE_FILE` (one JSON object).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WrapperUsage {
    #[serde(default)]
    pub model: Option<String>,
    pub input_tokens: u64,
    pub output_tokens: u64,
    #[serde(default)]
    pub cached_input_tokens: u64,
    #[serde(default)]
    pub usd: Option<f64>,
}

/// Dollars per million tokens of one model (policies.toml `[prices."<model>"]`).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub input_per_mtok: f64,
    pub output_per_mtok: f64,
    /// Cache reads; the input price when absent.
    #[serde(default)]
    pub cached_input_per_mtok: Option<f64>,
    /// Cache writes; the input price when absent.
    #[serde(default)]
    pub cache_write_per_mtok: Option<f64>,
}

pub type PriceTable = BTreeMap<String, Price>;

/// Read one agent run's usage from what it printed (`stdout`) and the usage file it left (`file`).
/// `Err` says why nothing could be read; the ledger then records tokens and dollars as unknown.
pub fn read(
    format: UsageFormat,
    stdout: &str,
    file: Option<&str>,
    prices: &PriceTable,
) -> Result<Usage, String> {
    let mut usage = match format {
        UsageFormat::Claude => claude(last_json_object(stdout)?),
        UsageFormat::Codex => codex(stdout),
        UsageFormat::Gemini => gemini(last_json_object(stdout)?),
        UsageFormat::Aider => aider(file.ok_or("aider wrote no analytics log")?),
        UsageFormat::File => wrapper(file.ok_or("the wrapper wrote no $FLASHTUNE_USAGE_FILE")?),
    }?;
    usage.source = format.to_string();
    usage.total();
    if usage.usd.is_none() {
        usage.usd = priced(&usage.models, prices);
        if usage.usd.is_some() {
            usage.usd_from = Some("price table".into());
        }
    } else {
        usage.usd_from = Some("agent".into());
    }
    Ok(usage)
}

/// The agent's last message to the user, from its CLI's own output: Claude Code's `result`, Gemini
/// CLI's `response`, Codex's last `agent_message`. `None` for other formats (a wrapper's stdout is
/// its own business) or where the output holds none.
pub fn final_message(format: Option<UsageFormat>, stdout: &str) -> Option<String> {
    let text = match format? {
        UsageFormat::Claude => last_json_object(stdout)
            .ok()?
            .get("result")?
            .as_str()?
            .to_owned(),
        UsageFormat::Gemini => last_json_object(stdout)
            .ok()?
            .get("response")?
            .as_str()?
            .to_owned(),
        UsageFormat::Codex => stdout
            .lines()
            .rev()
            .filter_map(|l| serde_json::from_str::<Value>(l.trim()).ok())
            .find(|v| {
                v.get("type").and_then(Value::as_str) == Some("item.completed")
                    && v.pointer("/item/type").and_then(Value::as_str) == Some("agent_message")
            })?
            .pointer("/item/text")?
            .as_str()?
            .to_owned(),
        UsageFormat::Aider | UsageFormat::File => return None,
    };
    (!text.trim().is_empty()).then_some(text)
}

impl Usage {
    fn total(&mut self) {
        self.input_tokens = self.models.iter().map(|m| m.input_tokens).sum();
        self.output_tokens = self.models.iter().map(|m| m.output_tokens).sum();
        self.cached_input_tokens = self.models.iter().map(|m| m.cached_input_tokens).sum();
    }
}

/// Dollars by the price table, when it prices every model used.
fn priced(models: &[ModelTokens], prices: &PriceTable) -> Option<f64> {
    if models.is_empty() {
        return None;
    }
    let mut usd = 0.0;
    for m in models {
        let p = prices.get(&m.model)?;
        let cached = p.cached_input_per_mtok.unwrap_or(p.input_per_mtok);
        let write = p.cache_write_per_mtok.unwrap_or(p.input_per_mtok);
        usd += (m.input_tokens as f64 * p.input_per_mtok
            + m.output_tokens as f64 * p.output_per_mtok
            + m.cached_input_tokens as f64 * cached
            + m.cache_write_tokens as f64 * write)
            / 1e6;
    }
    Some(usd)
}

/// The last line of `text` that parses as a JSON object (CLIs may print warnings first), or the whole text.
fn last_json_object(text: &str) -> Result<Value, String> {
    if let Ok(v @ Value::Object(_)) = serde_json::from_str::<Value>(text.trim()) {
        return Ok(v);
    }
    text.lines()
        .rev()
        .find_map(|l| match serde_json::from_str::<Value>(l.trim()) {
            Ok(v @ Value::Object(_)) => Some(v),
            _ => None,
        })
        .ok_or_else(|| "no JSON object in the agent's output".to_owned())
}

fn count(v: &Value, key: &str) -> u64 {
    v.get(key).and_then(Value::as_u64).unwrap_or(0)
}

/// Claude Code: `modelUsage` covers every model the run used (subagents included), `usage` only the main loop.
fn claude(v: Value) -> Result<Usage, String> {
    let models: Vec<ModelTokens> = v
        .get("modelUsage")
        .and_then(Value::as_object)
        .ok_or("no `modelUsage` in Claude Code's result")?
        .iter()
        .map(|(model, u)| ModelTokens {
            model: model.clone(),
            input_tokens: count(u, "inputTokens"),
            output_tokens: count(u, "outputTokens"),
            cached_input_tokens: count(u, "cacheReadInputTokens"),
            cache_write_tokens: count(u, "cacheCreationInputTokens"),
            reasoning_tokens: count(u, "thinkingTokens"),
            usd: u.get("costUSD").and_then(Value::as_f64),
        })
        .collect();
    Ok(Usage {
        usd: v.get("total_cost_usd").and_then(Value::as_f64),
        models,
        ..Usage::default()
    })
}

/// Codex: one `turn.completed` per turn, each with that turn's usage; the model is not named.
fn codex(stdout: &str) -> Result<Usage, String> {
    let mut total = ModelTokens {
        model: "codex".into(),
        ..ModelTokens::default()
    };
    let mut turns = 0;
    for line in stdout.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line.trim()) else {
            continue;
        };
        if v.get("type").and_then(Value::as_str) != Some("turn.completed") {
            continue;
        }
        let Some(u) = v.get("usage") else { continue };
        turns += 1;
        total.input_tokens += count(u, "input_tokens");
        total.output_tokens += count(u, "output_tokens");
        total.cached_input_tokens += count(u, "cached_input_tokens");
        total.cache_write_tokens += count(u, "cache_write_input_tokens");
        total.reasoning_tokens += count(u, "reasoning_output_tokens");
    }
    if turns == 0 {
        return Err("no `turn.completed` event in Codex's output".into());
    }
    // Codex counts cached input inside input_tokens; the ledger keeps them apart so prices apply once.
    total.input_tokens = total.input_tokens.saturating_sub(total.cached_input_tokens);
    Ok(Usage {
        models: vec![total],
        ..Usage::default()
    })
}

/// Gemini CLI: `prompt` tokens include the cached ones; `candidates` are the output.
fn gemini(v: Value) -> Result<Usage, String> {
    let models = v
        .pointer("/stats/models")
        .and_then(Value::as_object)
        .ok_or("no `stats.models` in Gemini CLI's result")?
        .iter()
        .map(|(model, m)| {
            let t = m.get("tokens").cloned().unwrap_or(Value::Null);
            let cached = count(&t, "cached");
            ModelTokens {
                model: model.clone(),
                input_tokens: count(&t, "prompt").saturating_sub(cached),
                output_tokens: count(&t, "candidates"),
                cached_input_tokens: cached,
                cache_write_tokens: 0,
                reasoning_tokens: count(&t, "thoughts"),
                usd: None,
            }
        })
        .collect();
    Ok(Usage {
        models,
        ..Usage::default()
    })
}

/// aider's analytics log: one JSON object per line; `message_send` events carry each call's tokens
/// and `cost`, so the run's dollars are their sum.
fn aider(log: &str) -> Result<Usage, String> {
    let mut by_model: BTreeMap<String, ModelTokens> = BTreeMap::new();
    let mut usd = 0.0;
    let mut any_cost = false;
    let mut sends = 0;
    for line in log.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line.trim()) else {
            continue;
        };
        if v.get("event").and_then(Value::as_str) != Some("message_send") {
            continue;
        }
        sends += 1;
        let p = v.get("properties").unwrap_or(&v);
        let model = p
            .get("main_model")
            .and_then(Value::as_str)
            .unwrap_or("aider")
            .to_owned();
        let m = by_model
            .entry(model.clone())
            .or_insert_with(|| ModelTokens {
                model,
                ..ModelTokens::default()
            });
        m.input_tokens += count(p, "prompt_tokens");
        m.output_tokens += count(p, "completion_tokens");
        if let Some(c) = p.get("cost").and_then(Value::as_f64) {
            usd += c;
            any_cost = true;
        }
    }
    if sends == 0 {
        return Err("no `message_send` event in aider's analytics log".into());
    }
    Ok(Usage {
        models: by_model.into_values().collect(),
        usd: any_cost.then_some(usd),
        ..Usage::default()
    })
}

fn wrapper(text: &str) -> Result<Usage, String> {
    let w: WrapperUsage = serde_json::from_str(text.trim())
        .map_err(|e| format!("$FLASHTUNE_USAGE_FILE is not flashtune's usage JSON: {e}"))?;
    Ok(Usage {
        models: vec![ModelTokens {
            model: w.model.unwrap_or_else(|| "unnamed".into()),
            input_tokens: w.input_tokens,
            output_tokens: w.output_tokens,
            cached_input_tokens: w.cached_input_tokens,
            ..ModelTokens::default()
        }],
        usd: w.usd,
        ..Usage::default()
    })
}
