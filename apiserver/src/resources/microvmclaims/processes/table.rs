//! A process's Table row: its claim, command, state and exit code, as `kubectl get pods`
//! shows a pod's.

use battery_api_machinery::table::TableColumnDefinition;
use battery_types::MicroVMProcess;
use serde_json::{Value, json};

/// The columns after Name and before Age.
pub(super) fn columns() -> Vec<TableColumnDefinition> {
    vec![
        TableColumnDefinition::new(
            "Claim",
            "string",
            "The MicroVMClaim whose MicroVM runs it.",
            0,
        ),
        TableColumnDefinition::new("Command", "string", "What it runs.", 0),
        TableColumnDefinition::new(
            "State",
            "string",
            "Running, Succeeded, Failed, or Lost when its Host's exec agent restarted while it ran.",
            0,
        ),
        TableColumnDefinition::new("Exit Code", "string", "Its exit code, once it exited.", 0),
        TableColumnDefinition::new(
            "Signal",
            "string",
            "The signal a stop sent that ended it.",
            1,
        ),
        TableColumnDefinition::new("Node", "string", "The Host whose exec agent runs it.", 1),
    ]
}

/// The cells of those columns.
pub(super) fn cells(process: &MicroVMProcess) -> Vec<Value> {
    let status = process.status.clone().unwrap_or_default();
    let or_none = |value: Option<String>| json!(value.unwrap_or_else(|| "<none>".to_owned()));
    vec![
        json!(process.spec.claim_name),
        json!(process.spec.command.join(" ")),
        or_none(status.phase.map(|phase| phase.as_str().to_owned())),
        or_none(status.exit_code.map(|code| code.to_string())),
        or_none(status.signal),
        or_none(status.node_name),
    ]
}

/// A selectable field's value.
pub(super) fn field(process: &MicroVMProcess, field: &str) -> Option<String> {
    match field {
        "spec.claimName" => Some(process.spec.claim_name.clone()),
        "status.phase" => process
            .status
            .as_ref()
            .and_then(|status| status.phase.as_ref())
            .map(|phase| phase.as_str().to_owned()),
        _ => None,
    }
}
