//! Scenario suites and what they share, compiled for tests only: the reconcilers against a
//! mocked API server (`mock_api`, calls asserted in order) and a mock agent
//! (`mock_agent`), against the simulator (`harness`), and against the real agent; the
//! objects they start from are `builders`'.

mod agent_calls;
mod agent_choice;
mod agent_secrets;
mod archive_restore_sim;
pub(crate) mod builders;
mod expand_scenarios;
mod expand_sim;
mod export_bench;
mod export_scenarios;
mod export_sim;
pub(crate) mod harness;
mod health_sim;
pub(crate) mod mock_agent;
pub(crate) mod mock_api;
mod real_agent;
mod scenarios;
mod snapshot_sim;
mod usage_scenarios;
mod version_skew;
