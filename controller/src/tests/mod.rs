//! Scenario suites and their fixtures, compiled for tests only: the reconcilers against a
//! mocked API server (calls asserted in order), against the simulator, and against the
//! real agent.

mod agent_calls;
mod agent_choice;
mod agent_secrets;
mod archive_restore_sim;
mod expand_scenarios;
mod expand_sim;
mod export_bench;
mod export_scenarios;
mod export_sim;
pub(crate) mod fixtures;
pub(crate) mod harness;
mod real_agent;
mod scenarios;
mod snapshot_sim;
mod usage_scenarios;
mod version_skew;
