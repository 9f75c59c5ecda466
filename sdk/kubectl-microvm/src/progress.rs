//! Progress while a bind waits for a MicroVM: a spinner on a terminal, a line per wait
//! otherwise (so logs of scripts show why a claim took long). And the bytes of a copy, on
//! a terminal only (a script's log gains nothing from them).

use std::io::IsTerminal as _;
use std::time::Duration;

use battery_sdk::Waiting;
use indicatif::{ProgressBar, ProgressStyle};

/// What the user sees of one bind.
pub struct Progress {
    spinner: Option<ProgressBar>,
}

impl Progress {
    pub fn binding(pool: &str) -> Self {
        let spinner = std::io::stderr().is_terminal().then(|| {
            let spinner = ProgressBar::new_spinner()
                .with_message(format!("binding a MicroVM of pool {pool}"));
            if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
                spinner.set_style(style);
            }
            spinner.enable_steady_tick(Duration::from_millis(100));
            spinner
        });
        Self { spinner }
    }

    /// A copy's bytes: a bar once the total is known, a counter until then.
    pub fn copying(what: &str) -> Self {
        let spinner = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::no_length().with_message(what.to_owned());
            if let Ok(style) =
                ProgressStyle::with_template("{spinner} {msg} {bytes} ({bytes_per_sec})")
            {
                bar.set_style(style);
            }
            bar.enable_steady_tick(Duration::from_millis(100));
            bar
        });
        Self { spinner }
    }

    /// The report [`battery_sdk::CopyPath::on_progress`] calls.
    pub fn on_copy(&self) -> impl Fn(u64, Option<u64>) + Send + Sync + 'static {
        let bar = self.spinner.clone();
        move |done, total| {
            let Some(bar) = &bar else { return };
            if let Some(total) = total
                && bar.length() != Some(total)
            {
                bar.set_length(total);
                if let Ok(style) = ProgressStyle::with_template(
                    "{msg} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})",
                ) {
                    bar.set_style(style.progress_chars("=> "));
                }
            }
            bar.set_position(done);
        }
    }

    /// The report [`battery_sdk::ClaimBuilder::on_wait`] calls.
    pub fn on_wait(&self) -> impl Fn(&Waiting) + Send + Sync + 'static {
        let spinner = self.spinner.clone();
        move |waiting| {
            let line = format!(
                "pool {} has no free MicroVM yet ({}); retrying in {}, {} left",
                waiting.pool,
                waiting.message,
                humantime::format_duration(round(waiting.retry_after)),
                humantime::format_duration(round(waiting.remaining)),
            );
            match &spinner {
                Some(spinner) => spinner.set_message(line),
                None => eprintln!("{line}"),
            }
        }
    }

    pub fn done(self) {
        if let Some(spinner) = self.spinner {
            spinner.finish_and_clear();
        }
    }
}

/// Whole seconds: `29s`, not `29s 812ms 3us`.
fn round(duration: Duration) -> Duration {
    Duration::from_secs(duration.as_secs_f64().round() as u64)
}
