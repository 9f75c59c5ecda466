//! The background process subcommands: `start`, `ps`, `attach`, `kill`.

use battery_sdk::types::ProcessPhase;

use crate::cli::{StartArgs, claim_name, process_name};
use crate::commands::{Context, age_of, table};
use crate::failure::Failure;
use crate::session;

pub async fn start(cx: &Context, args: StartArgs) -> Result<i32, Failure> {
    let mut command = cx
        .client
        .background(claim_name(&args.claim), args.command)
        .stdin(args.stdin);
    if let Some(name) = args.name {
        command = command.name(name);
    }
    for (key, value) in args.labels {
        command = command.label(key, value);
    }
    for (name, value) in args.env {
        command = command.env(name, value);
    }
    if let Some(dir) = args.workdir {
        command = command.working_dir(dir);
    }
    if let Some(grace) = args.grace_period {
        command = command.grace_period(grace);
    }
    let process = command.start().await.map_err(|e| cx.fail(&e))?;
    println!("microvmprocess/{}", process.name());
    Ok(0)
}

pub async fn list(cx: &Context, selector: Option<&str>) -> Result<i32, Failure> {
    let processes = cx
        .client
        .processes(selector)
        .await
        .map_err(|e| cx.fail(&e))?;
    if processes.is_empty() {
        eprintln!("No background processes in this namespace.");
        return Ok(0);
    }
    let mut rows =
        vec![["NAME", "CLAIM", "COMMAND", "STATE", "EXIT CODE", "AGE"].map(String::from)];
    for process in &processes {
        let object = process.object();
        let status = process.status();
        let exit = match (status.exit_code, &status.signal) {
            (Some(code), Some(signal)) => format!("{code} ({signal})"),
            (Some(code), None) => code.to_string(),
            (None, _) => "-".to_owned(),
        };
        rows.push([
            process.name().to_owned(),
            object.spec.claim_name.clone(),
            object.spec.command.join(" "),
            status
                .phase
                .as_ref()
                .map_or("-", ProcessPhase::as_str)
                .to_owned(),
            exit,
            age_of(&object.metadata),
        ]);
    }
    print!("{}", table(&rows));
    Ok(0)
}

pub async fn attach(cx: &Context, process: &str, stdin: bool) -> Result<i32, Failure> {
    let process = cx
        .client
        .process(process_name(process))
        .await
        .map_err(|e| cx.fail(&e))?;
    session::follow(process.attach(stdin))
        .await
        .map_err(|e| cx.fail(&e))
}

pub async fn kill(cx: &Context, process: &str) -> Result<i32, Failure> {
    let mut process = cx
        .client
        .process(process_name(process))
        .await
        .map_err(|e| cx.fail(&e))?;
    process.kill().await.map_err(|e| cx.fail(&e))?;
    eprintln!(
        "microvmprocess/{} stopping: SIGTERM sent, SIGKILL after {}s",
        process.name(),
        process.object().spec.grace_period_seconds()
    );
    Ok(0)
}
