//! Headless Chromium driven over the Chrome DevTools Protocol: just what the site test
//! needs (open a page, hear its console, evaluate an expression), on the WebSocket
//! client the e2e crate already has rather than a browser-automation crate.
//!
//! Chromium is started with `--remote-debugging-port=0` and a fresh `--user-data-dir`;
//! it writes the port it chose to `DevToolsActivePort` there. One page target is
//! attached in flattened mode, so its commands and events carry its `sessionId` on the
//! browser's one connection.

use std::collections::HashMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{SinkExt as _, StreamExt as _};
use serde_json::{Value, json};
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::Message;

/// How long Chromium may take to start, and a page to load.
const TIMEOUT: Duration = Duration::from_secs(60);
/// The flags every run takes: no sandbox (the tests run as root), and nothing that would
/// reach beyond loopback or make the run depend on a profile.
const FLAGS: [&str; 8] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--remote-debugging-port=0",
];

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Value>>>>;

/// A running headless Chromium with one attached page, killed when dropped unless closed.
pub struct Browser {
    child: Child,
    _profile: tempfile::TempDir,
    outgoing: mpsc::UnboundedSender<Message>,
    pending: Pending,
    events: mpsc::UnboundedReceiver<Value>,
    next_id: u64,
    session: String,
}

/// What a page said while it loaded: console errors, uncaught exceptions and failed
/// loads, each as one line.
pub type Problems = Vec<String>;

impl Browser {
    /// Starts `chromium` and attaches to a blank page.
    pub async fn start(chromium: &Path) -> Self {
        let profile = tempfile::Builder::new()
            .prefix("docs-chromium-")
            .tempdir()
            .expect("a profile directory");
        let child = Command::new(chromium)
            .args(FLAGS)
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", chromium.display()));
        let announced = profile.path().join("DevToolsActivePort");
        let endpoint =
            battery_e2e::eventually(TIMEOUT, "Chromium's DevToolsActivePort", async || {
                let text = std::fs::read_to_string(&announced).map_err(|e| e.to_string())?;
                match text.lines().collect::<Vec<_>>()[..] {
                    [port, path, ..] => Ok(format!("ws://127.0.0.1:{port}{path}")),
                    _ => Err(format!("not yet complete: {text:?}")),
                }
            })
            .await;
        let (socket, _) = tokio_tungstenite::connect_async(endpoint.as_str())
            .await
            .unwrap_or_else(|e| panic!("connect to Chromium at {endpoint}: {e}"));
        let (mut sink, mut stream) = socket.split();
        let (outgoing, mut to_send) = mpsc::unbounded_channel::<Message>();
        tokio::spawn(async move {
            while let Some(message) = to_send.recv().await {
                if sink.send(message).await.is_err() {
                    break;
                }
            }
        });
        let pending: Pending = Arc::default();
        let (event_tx, events) = mpsc::unbounded_channel();
        let answers = pending.clone();
        // Answers go to whoever sent the command; everything else is an event.
        tokio::spawn(async move {
            while let Some(Ok(message)) = stream.next().await {
                let Message::Text(text) = message else {
                    continue;
                };
                let Ok(value) = serde_json::from_str::<Value>(&text) else {
                    continue;
                };
                match value["id"].as_u64() {
                    Some(id) => {
                        let waiter = answers
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .remove(&id);
                        if let Some(waiter) = waiter {
                            let _ = waiter.send(value);
                        }
                    }
                    None => {
                        let _ = event_tx.send(value);
                    }
                }
            }
        });
        let mut browser = Self {
            child,
            _profile: profile,
            outgoing,
            pending,
            events,
            next_id: 0,
            session: String::new(),
        };
        let target = browser
            .call(None, "Target.createTarget", json!({"url": "about:blank"}))
            .await;
        let attached = browser
            .call(
                None,
                "Target.attachToTarget",
                json!({"targetId": target["targetId"], "flatten": true}),
            )
            .await;
        browser.session = attached["sessionId"]
            .as_str()
            .expect("attachToTarget answers a sessionId")
            .to_owned();
        for domain in ["Page.enable", "Runtime.enable", "Log.enable"] {
            browser.page_call(domain, json!({})).await;
        }
        browser
    }

    /// Closes Chromium as a user would and waits for it to exit, so that its helpers (its
    /// cache writer among them) have stopped before its profile is removed: a Chromium
    /// killed on drop leaves them writing there after the directory is gone.
    pub async fn close(mut self) {
        // Chromium may exit before it answers, so the answer is not waited for.
        drop(self.send(None, "Browser.close", json!({})));
        let exited = tokio::time::timeout(TIMEOUT, self.child.wait()).await;
        assert!(
            exited.is_ok(),
            "Chromium did not exit in {TIMEOUT:?} once closed"
        );
    }

    /// Opens `url`, waits for its load event, and returns what went wrong meanwhile
    /// (nothing, for a page that renders cleanly).
    pub async fn open(&mut self, url: &str) -> Problems {
        while self.events.try_recv().is_ok() {}
        let navigated = self.page_call("Page.navigate", json!({"url": url})).await;
        let mut problems = Problems::new();
        if let Some(error) = navigated["errorText"].as_str() {
            problems.push(format!("navigation failed: {error}"));
            return problems;
        }
        let loaded = tokio::time::timeout(TIMEOUT, async {
            while let Some(event) = self.events.recv().await {
                if event["sessionId"].as_str() != Some(self.session.as_str()) {
                    continue;
                }
                if event["method"] == "Page.loadEventFired" {
                    return;
                }
                problems.extend(problem(&event));
            }
        })
        .await;
        assert!(
            loaded.is_ok(),
            "{url} did not finish loading in {TIMEOUT:?}"
        );
        // Anything reported between the load event and now (scripts run on load).
        self.evaluate("0").await;
        while let Ok(event) = self.events.try_recv() {
            problems.extend(problem(&event));
        }
        problems
    }

    /// The value of `expression` (which must yield JSON) in the open page.
    pub async fn evaluate(&mut self, expression: &str) -> Value {
        let answer = self
            .page_call(
                "Runtime.evaluate",
                json!({"expression": expression, "returnByValue": true}),
            )
            .await;
        assert!(
            answer.get("exceptionDetails").is_none(),
            "evaluating {expression} threw: {}",
            answer["exceptionDetails"]
        );
        answer["result"]["value"].clone()
    }

    async fn page_call(&mut self, method: &str, params: Value) -> Value {
        let session = self.session.clone();
        self.call(Some(&session), method, params).await
    }

    async fn call(&mut self, session: Option<&str>, method: &str, params: Value) -> Value {
        let answer = tokio::time::timeout(TIMEOUT, self.send(session, method, params))
            .await
            .unwrap_or_else(|_| panic!("Chromium did not answer {method} in {TIMEOUT:?}"))
            .unwrap_or_else(|_| panic!("Chromium closed the connection during {method}"));
        assert!(
            answer.get("error").is_none(),
            "{method} failed: {}",
            answer["error"]
        );
        answer["result"].clone()
    }

    /// Sends `method` (to the page's `session`, or to the browser) and returns where its
    /// answer will come.
    fn send(
        &mut self,
        session: Option<&str>,
        method: &str,
        params: Value,
    ) -> oneshot::Receiver<Value> {
        self.next_id += 1;
        let id = self.next_id;
        let mut command = json!({"id": id, "method": method, "params": params});
        if let Some(session) = session {
            command["sessionId"] = json!(session);
        }
        let (tx, rx) = oneshot::channel();
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, tx);
        self.outgoing
            .send(Message::text(command.to_string()))
            .expect("the connection to Chromium is open");
        rx
    }
}

/// The problem an event reports, if it reports one: a console error, an uncaught
/// exception, or a log entry at error level (a resource that failed to load, a
/// refused script).
fn problem(event: &Value) -> Option<String> {
    let params = &event["params"];
    match event["method"].as_str()? {
        "Runtime.consoleAPICalled" if params["type"] == "error" || params["type"] == "assert" => {
            let args: Vec<String> = params["args"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|arg| {
                    arg["value"]
                        .as_str()
                        .map_or_else(|| arg.to_string(), str::to_owned)
                })
                .collect();
            Some(format!(
                "console.{}: {}",
                params["type"].as_str()?,
                args.join(" ")
            ))
        }
        "Runtime.exceptionThrown" => {
            let details = &params["exceptionDetails"];
            let description = details["exception"]["description"]
                .as_str()
                .or(details["text"].as_str())
                .unwrap_or_default();
            Some(format!("uncaught exception: {description}"))
        }
        "Log.entryAdded" if params["entry"]["level"] == "error" => {
            let entry = &params["entry"];
            // The browser asks for /favicon.ico by itself for a page that names no icon
            // (mdBook's toc.html frame): not a request of the page's.
            if entry["url"]
                .as_str()
                .is_some_and(|url| url.ends_with("/favicon.ico"))
            {
                return None;
            }
            Some(format!(
                "{} error: {} ({})",
                entry["source"].as_str().unwrap_or_default(),
                entry["text"].as_str().unwrap_or_default(),
                entry["url"].as_str().unwrap_or_default()
            ))
        }
        _ => None,
    }
}

#[test]
fn problems_are_console_errors_exceptions_and_failed_loads() {
    let console = json!({"method": "Runtime.consoleAPICalled", "params": {"type": "error", "args": [{"type": "string", "value": "boom"}]}});
    assert_eq!(problem(&console).as_deref(), Some("console.error: boom"));
    let info = json!({"method": "Runtime.consoleAPICalled", "params": {"type": "log", "args": []}});
    assert_eq!(problem(&info), None);
    let thrown = json!({"method": "Runtime.exceptionThrown", "params": {"exceptionDetails": {"text": "Uncaught", "exception": {"description": "TypeError: x is undefined"}}}});
    assert_eq!(
        problem(&thrown).as_deref(),
        Some("uncaught exception: TypeError: x is undefined")
    );
    let missing = json!({"method": "Log.entryAdded", "params": {"entry": {"level": "error", "source": "network", "text": "Failed to load resource", "url": "http://127.0.0.1/x.svg"}}});
    assert_eq!(
        problem(&missing).as_deref(),
        Some("network error: Failed to load resource (http://127.0.0.1/x.svg)")
    );
    let probe = json!({"method": "Log.entryAdded", "params": {"entry": {"level": "error", "source": "network", "text": "Failed to load resource", "url": "http://127.0.0.1/favicon.ico"}}});
    assert_eq!(problem(&probe), None);
}
