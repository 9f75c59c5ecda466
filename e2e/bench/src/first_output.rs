//! Time to first output, the figure peers now publish (as ComputeSDK's benchmark times
//! it): a claim created, then `echo` run in it, timed to the first byte of its output.
//! Made as a user's program makes it: with the Rust SDK, through kube-apiserver. Serially,
//! then for a burst created at once, each of which is timed from the burst's start.

use std::time::Instant;

use anyhow::{Context as _, Result, ensure};
use battery_sdk::Claim;
use tokio::io::AsyncReadExt as _;

use super::report::{Row, Unit, millis, percentiles, quantile};
use super::rig::{CpuUse, Rig};

pub const FIRST_OUTPUT: &str = "time to first output";

/// `serial` claims one after another, then `burst` at once, on `pool` (of at least
/// `serial + burst` MicroVMs).
pub async fn run(rig: &Rig, pool: &str, serial: usize, burst: usize) -> Result<Vec<Row>> {
    let client = rig.sdk_client().await?;
    let mut alone = Vec::with_capacity(serial);
    // Each process's CPU for a claim and its `echo` (not its release): where a burst's
    // time goes on a machine whose cores all of them share.
    let mut cpu_alone = Vec::with_capacity(serial);
    for _ in 0..serial {
        let cpu_before = rig.cpu_use()?;
        let started = Instant::now();
        let claim = first_output(&client, pool).await?;
        alone.push(started.elapsed());
        cpu_alone.push(rig.cpu_use()?.since(&cpu_before));
        claim.release().await.context("releasing a claim")?;
    }
    let cpu_before_burst = rig.cpu_use()?;
    let started = Instant::now();
    let tasks: Vec<_> = (0..burst)
        .map(|_| {
            let (client, pool) = (client.clone(), pool.to_owned());
            tokio::spawn(async move {
                let claim = first_output(&client, &pool).await?;
                Ok::<_, anyhow::Error>((started.elapsed(), claim))
            })
        })
        .collect();
    let mut together = Vec::with_capacity(burst);
    let mut claims = Vec::with_capacity(burst);
    for task in tasks {
        let (took, claim) = task.await.context("a claim of the burst panicked")??;
        together.push(took);
        claims.push(claim);
    }
    let all = started.elapsed();
    let cpu_burst = rig.cpu_use()?;
    for claim in claims {
        claim.release().await.context("releasing a claim")?;
    }
    let mut rows = Vec::new();
    let [p50, _, p99] = percentiles(FIRST_OUTPUT, "serial", &alone);
    rows.extend([p50, p99]);
    let [p50, _, p99] = percentiles(FIRST_OUTPUT, &format!("in a burst of {burst}"), &together);
    rows.extend([p50, p99]);
    rows.push(Row::millis(
        FIRST_OUTPUT,
        format!("a burst of {burst}: all first outputs"),
        all,
    ));
    rows.push(
        Row::new(
            FIRST_OUTPUT,
            format!("burst of {burst} / serial p50"),
            millis(quantile(&together, 0.5)) / millis(quantile(&alone, 0.5)),
            Unit::Times,
        )
        .at_most(2.0),
    );
    rows.extend(cpu_alone.into_iter().sum::<CpuUse>().rows(
        FIRST_OUTPUT,
        "a claim and its echo, serial",
        serial as f64,
    ));
    rows.extend(cpu_burst.since(&cpu_before_burst).rows(
        FIRST_OUTPUT,
        &format!("a claim and its echo, in the burst of {burst}"),
        burst as f64,
    ));
    Ok(rows)
}

/// Claims a MicroVM of `pool`, runs `echo` in it and reads the first byte it writes;
/// returns the claim, still held, so that its release is not timed.
async fn first_output(client: &battery_sdk::Client, pool: &str) -> Result<Claim> {
    let claim = client.claim(pool).send().await.context("claiming")?;
    let mut process = claim
        .exec(["echo", "first output"])
        .await
        .context("starting echo")?;
    let mut stdout = process.stdout().context("echo's stdout")?;
    let mut first = [0_u8; 1];
    let read = stdout.read(&mut first).await.context("echo's output")?;
    ensure!(read == 1, "echo ended without output");
    drop(stdout);
    let code = process.wait().await.context("echo's exit")?;
    ensure!(code == 0, "echo exited {code}");
    Ok(claim)
}
