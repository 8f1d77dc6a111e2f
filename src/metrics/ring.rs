//! `layout = "uring"`'s rings (crate `staleguard-ring`), read at each scrape, never on the
//! request path: `staleguard_uring_rings{receives="multishot"|"one_shot"}` (session threads
//! whose ring is up, by how it receives: one-shot when the kernel refused the multishot
//! receive's byte limit, Linux before 6.17), `staleguard_uring_sockets` (client and upstream
//! sockets on them) and `staleguard_uring_receives_starved_total` (receives that found none
//! of their thread's buffers free and waited for one). Absent when no ring was ever set up
//! (the other layouts, and anything but Linux).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};

/// Reads the process's rings at each scrape.
#[derive(Debug, Default)]
pub struct RingCollector;

impl Collector for RingCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(st) = staleguard_ring::stats() else {
            return Ok(());
        };
        let rings = Family::<[(&'static str, &'static str); 1], Gauge>::default();
        rings
            .get_or_create(&[("receives", "multishot")])
            .set(st.multishot as i64);
        rings
            .get_or_create(&[("receives", "one_shot")])
            .set(st.one_shot as i64);
        let e = encoder.encode_descriptor(
            "staleguard_uring_rings",
            "Session threads whose io_uring is up, by how its receives work (one_shot: the kernel refused the multishot receive's byte limit).",
            None,
            rings.metric_type(),
        )?;
        rings.encode(e)?;
        let sockets = ConstGauge::new(st.sockets as i64);
        let e = encoder.encode_descriptor(
            "staleguard_uring_sockets",
            "Client and upstream sockets on the io_urings.",
            None,
            sockets.metric_type(),
        )?;
        sockets.encode(e)?;
        let starved = ConstCounter::new(st.starved);
        let e = encoder.encode_descriptor(
            "staleguard_uring_receives_starved",
            "Receives that found none of their session thread's buffers free and waited for one.",
            None,
            starved.metric_type(),
        )?;
        starved.encode(e)
    }
}
