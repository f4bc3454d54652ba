//! The kubeconfig a stock client (kube-rs, kubectl) uses to reach the simulator.

/// A kubeconfig for a plain-HTTP server at `url`, without credentials (the simulator does
/// no authentication).
pub fn kubeconfig_yaml(url: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: kube-sim
  cluster:
    server: {url}
contexts:
- name: kube-sim
  context:
    cluster: kube-sim
    user: kube-sim
    namespace: default
current-context: kube-sim
users:
- name: kube-sim
  user: {{}}
preferences: {{}}
"
    )
}
