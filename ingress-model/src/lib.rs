//! Kubernetes `networking.k8s.io/v1` Ingress for meshkit.

pub mod k8s;
mod serde_impls;

pub use k8s::io::api::networking::v1::{
    HttpIngressPath, HttpIngressRuleValue, Ingress, IngressBackend, IngressClass,
    IngressClassList, IngressClassParametersReference, IngressClassSpec, IngressList,
    IngressLoadBalancerIngress, IngressLoadBalancerStatus, IngressPortStatus, IngressRule,
    IngressRuleValue, IngressServiceBackend, IngressSpec, IngressStatus, IngressTls,
    ServiceBackendPort,
};
