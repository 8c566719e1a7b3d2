//! Fault matrix row 11: a slow member (latency spikes on one member's I/O) must not fail anything, must not be
//! evicted, and must bound the array's tail latency to about the spikes themselves.

mod common_sim;

use std::time::{Duration, Instant};

use common_sim::*;

/// Runs a mixed workload of single-stripe reads and writes; returns each request's latency.
fn timed_workload(
    array: &Array,
    model: &mut BlockModel,
    seed: u64,
    requests: usize,
) -> Vec<Duration> {
    let g = array.geometry();
    let mut rng = SplitMix64::new(seed);
    let mut latencies = Vec::with_capacity(requests);
    for _ in 0..requests {
        let len = 1 + rng.below(g.stripe_bytes()) as usize;
        let offset = rng.below(g.array_bytes() - len as u64 + 1);
        if rng.one_in(2) {
            let mut data = vec![0u8; len];
            rng.fill(&mut data);
            let started = Instant::now();
            array
                .write(offset, &data, false)
                .expect("write under latency spikes");
            latencies.push(started.elapsed());
            model.write(offset, &data, WriteOutcome::Acked { durable: false });
        } else {
            let mut got = vec![0u8; len];
            let started = Instant::now();
            array
                .read(offset, &mut got)
                .expect("read under latency spikes");
            latencies.push(started.elapsed());
            model
                .check_read(offset, &got)
                .unwrap_or_else(|m| panic!("read under latency spikes: {m}"));
        }
    }
    latencies
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let at = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[at]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[test]
fn row11_slow_member() {
    let spike = Duration::from_millis(20);
    let requests = 400;
    let filled = Filled::new(Level::Raid5, 4, 16384, 16, 1100);
    let mut report = Vec::new();
    let mut bounds = Vec::new();
    for spiky in [false, true] {
        let (io, array) = assemble_cow(&filled.base, &[], 11, reference()).expect("assemble");
        if spiky {
            io.add(
                Scope::slot(2),
                Fault::Delay {
                    delay: spike,
                    one_in: 10,
                    sleep: true,
                },
            );
        }
        let mut model = filled.model();
        let mut lat = timed_workload(&array, &mut model, 1111, requests);
        verify_all(&array, &mut model, "after the workload");
        for slot in 0..4 {
            assert_eq!(
                array.slot_state(slot),
                SlotState::Active,
                "no false failure"
            );
        }
        lat.sort();
        let (p50, p99, p999, max) = (
            percentile(&lat, 0.5),
            percentile(&lat, 0.99),
            percentile(&lat, 0.999),
            lat[lat.len() - 1],
        );
        let delayed = io.counts().delayed;
        if spiky {
            assert!(delayed > 0, "spikes injected");
            // A request is at most a read batch and a write batch: two spikes, plus what the run without spikes
            // needed, plus room for a loaded machine.
            let bound = 2 * spike + bounds[0] + Duration::from_millis(100);
            assert!(
                p999 <= bound,
                "p99.9 {:.1} ms beyond {:.1} ms",
                ms(p999),
                ms(bound)
            );
        }
        bounds.push(p999);
        report.push(format!(
            "{}: p50 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms, max {:.2} ms{}",
            if spiky {
                "member 2 spiking"
            } else {
                "no spikes"
            },
            ms(p50),
            ms(p99),
            ms(p999),
            ms(max),
            if spiky {
                format!(" ({delayed} I/Os delayed {} ms)", spike.as_millis())
            } else {
                String::new()
            }
        ));
    }
    figure(
        "11",
        "row11_slow_member",
        &format!(
            "{requests} requests each, RAID5/4 in memory; {}; no request failed, no member evicted",
            report.join("; ")
        ),
    );
}
