//! Background processes (ADR 44): commands that run on in a MicroVM after the client
//! that started them leaves, in a table of the Host's processes that outlives the agent.
//! `table` (the table and its file) sits below `start`, `follow`, `stop` and `attach`,
//! each a job of [`Processes`]; `live` (what is followed while a process runs),
//! `output` (its retained output) and `record` (what the file keeps) below all.

mod attach;
mod follow;
mod live;
mod output;
mod record;
mod start;
mod stop;
mod table;

pub use table::{LoadError, Processes};
