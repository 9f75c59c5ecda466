//! The built site: `mdbook build docs` without a warning, every Markdown file of `docs/`
//! in the book, and every built page opened in headless Chromium, served over loopback
//! HTTP as a web server would serve it: each renders (a title and a non-empty `main`)
//! with no console error, and each of its links into the site names a page that exists
//! and, with a fragment, an element of that page with that id.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use axum::extract::State;
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use crate::cdp::Browser;

/// What each page yields once loaded: its title, the length of its `main` text, every
/// link target (resolved by the browser), and every element id.
const INSPECT: &str = r#"JSON.stringify({
  title: document.title,
  main: (document.querySelector("main") || {innerText: ""}).innerText.trim().length,
  links: [...document.querySelectorAll("a[href]")].map(a => a.href),
  ids: [...document.querySelectorAll("[id]")].map(e => e.id),
})"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_renders_without_a_console_error_and_every_internal_link_resolves() {
    let (Some(mdbook), Some(chromium)) = (crate::tool("mdbook"), crate::tool("chromium")) else {
        return;
    };
    // Where the test command builds it too: a book built elsewhere would take in a
    // docs/book/ left from an earlier build, since the pages are all of docs/.
    let book = crate::docs_dir().join("book");
    let built = std::process::Command::new(&mdbook)
        .arg("build")
        .arg(crate::docs_dir())
        .output()
        .expect("run mdbook");
    let log = String::from_utf8_lossy(&built.stderr);
    assert!(built.status.success(), "mdbook build docs failed:\n{log}");
    let warnings: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("WARN") || line.contains("ERROR"))
        .collect();
    assert!(warnings.is_empty(), "mdbook build docs warned:\n{log}");

    let pages = html_files(&book);
    assert!(
        pages
            .iter()
            .any(|page| page == Path::new("quick-start.html")),
        "the book has no quick-start.html: {pages:?}"
    );
    let base = serve(book.clone()).await;
    let mut browser = Browser::start(&chromium).await;
    let mut seen: BTreeMap<String, Page> = BTreeMap::new();
    let mut failures = Vec::new();
    for page in &pages {
        let url = format!("{base}{}", page.display());
        let problems = browser.open(&url).await;
        let inspected: Value = serde_json::from_str(
            browser
                .evaluate(INSPECT)
                .await
                .as_str()
                .expect("the inspection yields a string"),
        )
        .expect("the inspection is JSON");
        failures.extend(problems.iter().map(|p| format!("{url}: {p}")));
        // toc.html is mdBook's table of contents for browsers without scripts, shown in
        // a frame: not a page of its own.
        let toc_frame = page == Path::new("toc.html");
        let empty = inspected["title"].as_str().unwrap_or_default().is_empty()
            || inspected["main"].as_u64().unwrap_or_default() == 0;
        if empty && !toc_frame {
            failures.push(format!("{url}: rendered no title or an empty page"));
        }
        let strings = |key: &str| -> Vec<String> {
            inspected[key]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        };
        seen.insert(
            url,
            Page {
                links: strings("links"),
                ids: strings("ids").into_iter().collect(),
            },
        );
    }
    browser.close().await;
    for (url, page) in &seen {
        for link in &page.links {
            if let Some(broken) = check_link(&base, &book, &seen, link) {
                failures.push(format!("{url}: link {link}: {broken}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} pages have problems:\n{}",
        failures.len(),
        pages.len(),
        failures.join("\n")
    );
}

#[test]
fn every_markdown_file_of_docs_is_in_the_book() {
    let docs = crate::docs_dir();
    let summary = std::fs::read_to_string(docs.join("SUMMARY.md")).expect("docs/SUMMARY.md");
    let mut missing = Vec::new();
    let mut stack = vec![docs.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read docs/").flatten() {
            let path = entry.path();
            if path.is_dir() && path.file_name().is_some_and(|name| name != "book") {
                stack.push(path);
            } else if path.extension().is_some_and(|ext| ext == "md") {
                let relative = path.strip_prefix(&docs).expect("under docs/");
                let relative = relative.to_string_lossy();
                // 404.md is book.toml's `input-404`, not a chapter.
                let listed = summary.contains(&format!("]({relative})"));
                if relative != "SUMMARY.md" && relative != "404.md" && !listed {
                    missing.push(relative.into_owned());
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/SUMMARY.md does not list {missing:?}: add them, or mdBook leaves them out of the site"
    );
}

struct Page {
    links: Vec<String>,
    ids: BTreeSet<String>,
}

/// Why `link` (absolute, as the browser resolved it) does not resolve, if it points
/// into the site; `None` for a good or external link.
fn check_link(
    base: &str,
    book: &Path,
    seen: &BTreeMap<String, Page>,
    link: &str,
) -> Option<String> {
    let origin = base.trim_end_matches('/');
    if !link.starts_with(origin) {
        // Another site (or a `mailto:`): not ours to check here.
        return None;
    }
    let (target, fragment) = link.split_once('#').unwrap_or((link, ""));
    let Some(path) = target.strip_prefix(base) else {
        return Some("points outside the site".to_owned());
    };
    let path = path.split('?').next().unwrap_or_default();
    let file = if path.is_empty() || path.ends_with('/') {
        format!("{path}index.html")
    } else {
        path.to_owned()
    };
    if !book.join(&file).is_file() {
        return Some(format!("no file {file} in the built site"));
    }
    if fragment.is_empty() {
        return None;
    }
    let page = seen.get(&format!("{base}{file}"))?;
    (!page.ids.contains(fragment)).then(|| format!("{file} has no element with id {fragment:?}"))
}

/// Every `.html` file under `book`, relative to it.
fn html_files(book: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![book.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)
            .expect("read the built book")
            .flatten()
        {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|ext| ext == "html") {
                files.push(path.strip_prefix(book).expect("under the book").to_owned());
            }
        }
    }
    files.sort();
    files
}

/// Serves `book` on a loopback port for as long as the test runs; returns its base URL
/// (ending in `/`).
async fn serve(book: PathBuf) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let address = listener.local_addr().expect("its address");
    let app = axum::Router::new().fallback(file).with_state(book);
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{address}/")
}

/// A file of the book, with the content type a web server would give it; `404.html`
/// for a missing one, as mdBook expects of its server.
async fn file(State(book): State<PathBuf>, uri: Uri) -> Response {
    let path = uri.path().trim_start_matches('/');
    let path = if path.is_empty() || path.ends_with('/') {
        format!("{path}index.html")
    } else {
        path.to_owned()
    };
    let safe = !path.split('/').any(|part| part == "..");
    let (status, file) = match std::fs::read(book.join(&path)) {
        Ok(body) if safe => (StatusCode::OK, (path, body)),
        _ => (
            StatusCode::NOT_FOUND,
            (
                "404.html".to_owned(),
                std::fs::read(book.join("404.html")).unwrap_or_default(),
            ),
        ),
    };
    let content_type = match Path::new(&file.0).extension().and_then(|e| e.to_str()) {
        Some("html") => "text/html; charset=utf-8",
        Some("css") => "text/css",
        Some("js") => "text/javascript",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("json") => "application/json",
        Some("woff2") => "font/woff2",
        Some("woff") => "font/woff",
        Some("ttf") => "font/ttf",
        _ => "application/octet-stream",
    };
    (status, [(header::CONTENT_TYPE, content_type)], file.1).into_response()
}
