//! The admin endpoint over a real loopback socket: readiness, a strict parse of the metrics
//! with exact values, the config dump and the log filter.

use std::sync::{Arc, Mutex};

use meshkit_admin::{Admin, LogFilter, Readiness, Registry};
use meshkit_test_support::{http_get, scrape};
use prometheus_client::metrics::counter::Counter;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_paths_answer_over_loopback() {
    let mut registry = Registry::default();
    let served = Counter::<u64>::default();
    registry.register("test_served", "Requests the test served", served.clone());
    let readiness = Readiness::default();
    let bound = readiness.condition("listeners bound");
    let filters = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&filters);
    let admin = Admin::new("test-part", registry)
        .with_readiness(readiness.clone())
        .with_config_dump(|| serde_json::json!({"workloads": ["a", "b"]}))
        .with_log_filter(LogFilter::new(move |f| {
            seen.lock().unwrap().push(f.to_owned());
            Ok(())
        }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(admin.serve(listener, async move {
        let _ = stopped.await;
    }));

    let blocking =
        move |path: &'static str| tokio::task::spawn_blocking(move || http_get(addr, path));
    let (status, body) = blocking("/healthz/ready").await.unwrap();
    assert_eq!(
        (status, body.as_str()),
        (503, "not ready: waiting for listeners bound\n")
    );
    bound.set_ready();
    assert_eq!(blocking("/healthz/ready").await.unwrap().0, 200);

    served.inc_by(3);
    let metrics = tokio::task::spawn_blocking(move || scrape(addr))
        .await
        .unwrap();
    assert_eq!(metrics.value("test_served_total", &[]), Some(3.0));
    assert_eq!(
        metrics.value(
            "meshkit_build",
            &[
                ("component", "test-part"),
                ("version", env!("CARGO_PKG_VERSION"))
            ]
        ),
        Some(1.0)
    );
    let rss = metrics
        .value("process_resident_memory_bytes", &[])
        .expect("rss");
    assert!(rss > 1024.0 * 1024.0, "{rss}");
    assert!(
        metrics
            .value("process_cpu_seconds_total", &[])
            .expect("cpu")
            > 0.0
    );
    assert!(metrics.value("process_open_fds", &[]).expect("fds") >= 3.0);
    // The Envoy-style path serves the same.
    let (status, text) = blocking("/stats/prometheus").await.unwrap();
    assert_eq!(status, 200);
    meshkit_test_support::openmetrics::parse(&text).unwrap();

    let (status, dump) = blocking("/config_dump").await.unwrap();
    assert_eq!(status, 200);
    let dump: serde_json::Value = serde_json::from_str(&dump).unwrap();
    assert_eq!(dump, serde_json::json!({"workloads": ["a", "b"]}));

    let (status, _) = tokio::task::spawn_blocking(move || {
        meshkit_test_support::http_request(addr, "PUT", "/logging?level=debug")
    })
    .await
    .unwrap();
    assert_eq!(status, 200);
    assert_eq!(*filters.lock().unwrap(), ["debug"]);

    readiness.start_draining();
    assert_eq!(
        blocking("/healthz/ready").await.unwrap(),
        (503, "not ready: draining\n".to_owned())
    );
    stop.send(()).unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(20), serving)
        .await
        .expect("the admin server stops")
        .unwrap()
        .unwrap();
}
