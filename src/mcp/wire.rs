//! The wire under rmcp: every line the client sends is held to JSON-RPC 2.0 before rmcp sees it.
//!
//! rmcp ignores a line that is not JSON and answers a message it cannot read without its id; the
//! specification asks for more. Here a line that does not parse gets a Parse error (-32700, `"id":
//! null`); valid JSON that is no request (not an object, a batch, no `"jsonrpc": "2.0"`, a missing or
//! non-string method, params that are neither object nor array) gets Invalid Request (-32600) with
//! the request's id where it had a usable one (a string or an integer), else `null`; a request of the
//! right shape whose params rmcp cannot read gets Invalid params (-32602) with its id. A notification
//! (a `method` and no `id`) is never answered, whatever is wrong with it. What passes goes to rmcp
//! unchanged; its output and these answers share stdout a whole line at a time.
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, DuplexStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// A message longer than this (one line) is refused unread, as rmcp's own transport caps it.
const MAX_LINE: usize = 16 * 1024 * 1024;
const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const INVALID_PARAMS: i64 = -32602;
/// Room in each pipe between this layer and rmcp.
const PIPE_BYTES: usize = 1 << 20;

/// What becomes of one line from the client.
#[derive(Debug, PartialEq)]
pub enum Line {
    /// A message rmcp reads: passed on as it came.
    Pass,
    /// Answered here with this JSON-RPC error response; rmcp never sees it.
    Answer(Value),
    /// Dropped unanswered (a notification or a response that rmcp cannot read), with why.
    Drop(String),
}

/// The JSON-RPC 2.0 error response to the request with `id`.
fn error_response(id: Value, code: i64, message: String) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "error": { "code": code, "message": message } })
}

/// Judge one line (without its newline) against JSON-RPC 2.0 and what rmcp can read.
pub fn classify(line: &[u8]) -> Line {
    let line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
    let value: Value = match serde_json::from_slice(line) {
        Ok(v) => v,
        Err(e) => {
            return Line::Answer(error_response(
                Value::Null,
                PARSE_ERROR,
                format!("Parse error: {e}"),
            ))
        }
    };
    let invalid = |id: Value, why: &str| {
        Line::Answer(error_response(
            id,
            INVALID_REQUEST,
            format!("Invalid Request: {why}"),
        ))
    };
    let object = match &value {
        Value::Object(o) => o,
        Value::Array(_) => {
            return invalid(
                Value::Null,
                "a batch (an array); MCP takes one request object per line",
            )
        }
        _ => return invalid(Value::Null, "not a JSON object"),
    };
    let readable = || serde_json::from_value::<rmcp::model::ClientJsonRpcMessage>(value.clone());
    let method = object.get("method");
    let Some(id) = object.get("id") else {
        // A notification is never answered, even a malformed one; an object with neither an id nor
        // a method string is no request at all.
        return match method {
            Some(Value::String(m)) => match readable() {
                Ok(_) => Line::Pass,
                Err(e) => Line::Drop(format!("unreadable notification `{m}`: {e}")),
            },
            _ => invalid(Value::Null, "no `id` and no `method` string"),
        };
    };
    // The client's response to a request of the server's: rmcp matches it, nothing answers it.
    if method.is_none() && (object.contains_key("result") || object.contains_key("error")) {
        return match readable() {
            Ok(_) => Line::Pass,
            Err(e) => Line::Drop(format!("unreadable response: {e}")),
        };
    }
    let usable = id.is_string() || id.is_i64() || id.is_u64();
    if !usable {
        return invalid(
            Value::Null,
            &format!("`id` must be a string or an integer, not {id}"),
        );
    }
    if object.get("jsonrpc") != Some(&json!("2.0")) {
        return invalid(id.clone(), "`jsonrpc` must be \"2.0\"");
    }
    let Some(Value::String(method)) = method else {
        return invalid(id.clone(), "`method` must be a string");
    };
    match object.get("params") {
        None | Some(Value::Object(_)) | Some(Value::Array(_)) => {}
        Some(other) => {
            return invalid(
                id.clone(),
                &format!("`params` must be an object or an array, not {other}"),
            )
        }
    }
    let invalid_params = |why: String| {
        Line::Answer(error_response(
            id.clone(),
            INVALID_PARAMS,
            format!("Invalid params for `{method}`: {why}"),
        ))
    };
    match readable() {
        // rmcp reads an MCP method whose params do not fit as a custom request, and answers it
        // "method not found": the method is there, its params are wrong.
        Ok(rmcp::model::JsonRpcMessage::Request(r))
            if matches!(r.request, rmcp::model::ClientRequest::CustomRequest(_))
                && MCP_REQUESTS.contains(&method.as_str()) =>
        {
            let params = object.get("params").cloned().unwrap_or(Value::Null);
            invalid_params(if method == "tools/call" {
                match serde_json::from_value::<rmcp::model::CallToolRequestParams>(params) {
                    Err(e) => e.to_string(),
                    Ok(_) => "they do not fit the method".to_owned(),
                }
            } else {
                "they do not fit the method".to_owned()
            })
        }
        Ok(_) => Line::Pass,
        Err(e) => invalid_params(e.to_string()),
    }
}

/// The requests of MCP a client sends (rmcp's `ClientRequest`, but for custom ones).
const MCP_REQUESTS: [&str; 21] = [
    "ping",
    "initialize",
    "server/discover",
    "completion/complete",
    "logging/setLevel",
    "prompts/get",
    "prompts/list",
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "resources/directory/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "subscriptions/listen",
    "tools/call",
    "tools/list",
    "tasks/get",
    "tasks/update",
    "tasks/cancel",
    "skills/list",
    "skills/get",
];

/// One line read, at most [`MAX_LINE`] bytes kept.
enum Read {
    Line(Vec<u8>),
    TooLong,
    End,
}

async fn read_line<R: AsyncRead + Unpin>(input: &mut BufReader<R>) -> Read {
    let mut line = Vec::new();
    let mut too_long = false;
    loop {
        let available = match input.fill_buf().await {
            Ok(b) => b,
            Err(e) => {
                tracing::error!("cannot read the MCP client's input: {e}");
                return Read::End;
            }
        };
        if available.is_empty() {
            // A last line without its newline is judged like any other.
            return if too_long {
                Read::TooLong
            } else if line.is_empty() {
                Read::End
            } else {
                Read::Line(line)
            };
        }
        let newline = available.iter().position(|&b| b == b'\n');
        let take = newline.map_or(available.len(), |i| i + 1);
        if !too_long && line.len() + take > MAX_LINE {
            too_long = true;
            line = Vec::new();
        }
        if !too_long {
            line.extend_from_slice(&available[..take]);
        }
        input.consume(take);
        if newline.is_some() {
            return if too_long {
                Read::TooLong
            } else {
                Read::Line(line)
            };
        }
    }
}

/// Put the gate between the client's `input`/`output` and rmcp: returns the reader and the writer
/// rmcp serves on, and the task that carries rmcp's output (and the gate's answers) to `output`;
/// it ends once rmcp's side closes.
pub(super) fn gate<R, W>(input: R, output: W) -> (DuplexStream, DuplexStream, JoinHandle<()>)
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (rmcp_reads, mut to_rmcp) = tokio::io::duplex(PIPE_BYTES);
    let (rmcp_writes, from_rmcp) = tokio::io::duplex(PIPE_BYTES);
    let (answers, mut answered) = mpsc::unbounded_channel::<Value>();
    tokio::spawn(async move {
        let mut input = BufReader::new(input);
        loop {
            let line = match read_line(&mut input).await {
                Read::End => break,
                Read::TooLong => {
                    let _ = answers.send(error_response(
                        Value::Null,
                        PARSE_ERROR,
                        format!("Parse error: a message longer than {MAX_LINE} bytes"),
                    ));
                    continue;
                }
                Read::Line(line) => line,
            };
            let text = line.strip_suffix(b"\n").unwrap_or(&line);
            let text = text.strip_suffix(b"\r").unwrap_or(text);
            if text.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            match classify(text) {
                Line::Pass => {
                    if to_rmcp.write_all(text).await.is_err()
                        || to_rmcp.write_all(b"\n").await.is_err()
                    {
                        break;
                    }
                }
                Line::Answer(reply) => {
                    let _ = answers.send(reply);
                }
                Line::Drop(why) => tracing::debug!("dropped unanswered: {why}"),
            }
        }
        // The client closed its end: rmcp reads the end of input and the service stops.
        let _ = to_rmcp.shutdown().await;
    });
    let carry = tokio::spawn(async move {
        let mut output = output;
        let mut from_rmcp = BufReader::new(from_rmcp);
        let mut line = Vec::new();
        let mut answers_open = true;
        loop {
            tokio::select! {
                read = from_rmcp.read_until(b'\n', &mut line) => {
                    match read {
                        Ok(0) | Err(_) => break,
                        Ok(_) if line.ends_with(b"\n") => {
                            if output.write_all(&line).await.is_err() || output.flush().await.is_err() {
                                return;
                            }
                            line.clear();
                        }
                        Ok(_) => {}
                    }
                }
                answer = answered.recv(), if answers_open => match answer {
                    Some(reply) => {
                        let mut bytes = serde_json::to_vec(&reply).unwrap_or_default();
                        bytes.push(b'\n');
                        if output.write_all(&bytes).await.is_err() || output.flush().await.is_err() {
                            return;
                        }
                    }
                    None => answers_open = false,
                },
            }
        }
        // rmcp is done: what the gate answered before the end still goes out.
        while let Ok(reply) = answered.try_recv() {
            let mut bytes = serde_json::to_vec(&reply).unwrap_or_default();
            bytes.push(b'\n');
            let _ = output.write_all(&bytes).await;
        }
        let _ = output.flush().await;
    });
    (rmcp_reads, rmcp_writes, carry)
}
