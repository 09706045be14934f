//! Workloads learned over xDS reach only the target ports of their services: the ports the
//! workload API maps service ports to. A workload that backs no service reaches none.

use std::collections::BTreeMap;
use std::net::IpAddr;

use meshkit_identity::TrustDomain;
use meshkit_mesh::feed::mesh_config;
use meshkit_mesh::proto::workload::{Address, Port, PortList, Service, Workload, address};
use meshkit_mesh::resources::AddressResource;

fn workload(name: &str, ip: [u8; 4], services: &[(&str, &[(u32, u32)])]) -> AddressResource {
    let services: BTreeMap<String, PortList> = services
        .iter()
        .map(|(key, ports)| {
            let ports = ports
                .iter()
                .map(|&(service_port, target_port)| Port {
                    service_port,
                    target_port,
                    ..Default::default()
                })
                .collect();
            ((*key).to_owned(), PortList { ports })
        })
        .collect();
    let w = Workload {
        uid: format!("Kubernetes/networking.istio.io/WorkloadEntry/shop/{name}"),
        name: name.to_owned(),
        namespace: "shop".to_owned(),
        addresses: vec![ip.to_vec()],
        service_account: name.to_owned(),
        node: "node-a".to_owned(),
        services,
        ..Default::default()
    };
    AddressResource {
        name: w.uid.clone(),
        address: Address {
            r#type: Some(address::Type::Workload(w)),
        },
    }
}

fn service(hostname: &str, ports: &[(u32, u32)]) -> AddressResource {
    let s = Service {
        name: hostname.split('.').next().unwrap_or_default().to_owned(),
        namespace: "shop".to_owned(),
        hostname: hostname.to_owned(),
        ports: ports
            .iter()
            .map(|&(service_port, target_port)| Port {
                service_port,
                target_port,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    AddressResource {
        name: format!("shop/{hostname}"),
        address: Address {
            r#type: Some(address::Type::Service(s)),
        },
    }
}

const WEB: &str = "web.shop.svc.cluster.local";
const ADMIN: &str = "admin.shop.svc.cluster.local";

#[test]
fn an_xds_workload_serves_only_its_services_target_ports() {
    let resources = [
        // web: service port 80 to 8080 (the workload's own mapping), 443 to 8443 (the
        // service's, the workload leaves it at 0).
        service(WEB, &[(80, 8080), (443, 8443)]),
        service(ADMIN, &[(9000, 0)]),
        workload(
            "web-1",
            [127, 0, 0, 11],
            &[
                (&format!("shop/{WEB}"), &[(80, 8080), (443, 0)]),
                (&format!("shop/{ADMIN}"), &[(9000, 9090)]),
            ],
        ),
        // A workload that names a service but lists none of its ports: the service's target
        // ports apply.
        workload("web-2", [127, 0, 0, 12], &[(&format!("shop/{WEB}"), &[])]),
        // Backs no service: nothing is reachable.
        workload("batch", [127, 0, 0, 13], &[]),
    ];
    let mesh = mesh_config(resources.iter());
    let index = mesh.index(&TrustDomain::new("cluster.local").unwrap());
    let serves = |ip: [u8; 4], port: u16| {
        let (w, _) = index.workload(IpAddr::from(ip)).expect("known workload");
        w.serves_port(port)
    };
    for port in [8080, 8443, 9090] {
        assert!(serves([127, 0, 0, 11], port), "web-1 serves {port}");
    }
    for port in [80, 443, 9000, 15008, 22, 1] {
        assert!(
            !serves([127, 0, 0, 11], port),
            "web-1 does not serve {port}"
        );
    }
    assert!(serves([127, 0, 0, 12], 8080) && serves([127, 0, 0, 12], 8443));
    assert!(!serves([127, 0, 0, 12], 9090));
    for port in [1, 80, 8080, 15008] {
        assert!(
            !serves([127, 0, 0, 13], port),
            "batch does not serve {port}"
        );
    }
}

#[test]
fn the_served_ports_survive_the_json_form() {
    // A mesh dumped to a file and read back keeps "no port" apart from "any port".
    let resources = [
        service(WEB, &[(80, 8080)]),
        workload("batch", [127, 0, 0, 13], &[]),
    ];
    let mesh = mesh_config(resources.iter());
    let json = serde_json::to_string(&mesh).unwrap();
    let back: meshkit_mesh::MeshConfig = serde_json::from_str(&json).unwrap();
    let index = back.index(&TrustDomain::new("cluster.local").unwrap());
    let (w, _) = index.workload(IpAddr::from([127, 0, 0, 13])).unwrap();
    assert!(!w.serves_port(8080));
}
