use super::*;

#[test]
fn under_a_budget_the_batch_carries_a_tenth_of_a_second_of_the_rate() {
    // Without a budget: the configured size, whatever the rate.
    assert_eq!(batch_size(50.0, 1_000, false), 1_000);
    assert_eq!(batch_size(1e9, 1_000, false), 1_000);
    // With one: a tenth of a second's worth, between the floor and the configured size.
    assert_eq!(batch_size(5_000.0, 1_000, true), 500);
    assert_eq!(batch_size(1e9, 1_000, true), 1_000);
    assert_eq!(batch_size(50.0, 1_000, true), BATCH_FLOOR);
    assert_eq!(batch_size(313.0, 1_000, true), 31);
    // A configured size below the floor is its own floor.
    assert_eq!(batch_size(50.0, 5, true), 5);
    assert_eq!(batch_size(50.0, 0, false), 1);
}

#[test]
fn a_slow_start_doubles_until_the_first_decrease_then_adds_steps() {
    let c = Clock::new();
    let s = ThrottleSettings {
        max_docs_per_sec: 1_600.0,
        min_docs_per_sec: 50.0,
        healthy_interval: Duration::from_secs(5),
        ..settings()
    };
    let mut rate = AdaptiveRate::with_slow_start(s, c.at(0));
    assert_eq!(rate.applied(), 1_600.0 / SLOW_START_FRACTION);
    // Time alone grows nothing: nothing the backfill wrote has been judged.
    assert_eq!(rate.tick(c.at(30_000)), 200.0);
    // The application within its budget doubles it, once per healthy interval.
    assert!(rate.on_app_within_budget(c.at(30_000)));
    assert_eq!(rate.applied(), 400.0);
    assert!(!rate.on_app_within_budget(c.at(32_000)));
    assert!(rate.on_app_within_budget(c.at(35_000)));
    assert_eq!(rate.tick(c.at(36_000)), 800.0);
    // A decrease ends the slow start: halved, then a step per healthy interval, and a
    // judgement within the budget no longer doubles.
    assert!(rate.on_app_over_budget(c.at(36_000)));
    assert_eq!(rate.applied(), 400.0);
    assert!(!rate.on_app_within_budget(c.at(41_000)));
    assert_eq!(rate.tick(c.at(41_000)), 500.0);
    assert_eq!(rate.tick(c.at(46_000)), 600.0);
    // Doubling never passes the maximum.
    let mut quick = AdaptiveRate::with_slow_start(s, c.at(0));
    for i in 1..=5 {
        quick.on_app_within_budget(c.at(i * 5_000));
    }
    assert_eq!(quick.applied(), 1_600.0);
    // A small maximum starts at the floor, not below it.
    let small = ThrottleSettings {
        max_docs_per_sec: 300.0,
        ..s
    };
    assert_eq!(
        AdaptiveRate::with_slow_start(small, c.at(0)).applied(),
        50.0
    );
}

/// Router `router`'s report at `at`: `count` operations of `ms` each but `slow` of
/// `slow_ms`, `errors` of them failed.
fn report(router: &str, at: i64, count: u64, ms: f64, slow: u64, slow_ms: f64) -> RouterReport {
    let mut h = LatencyHistogram::default();
    for i in 0..count {
        h.record(((if i < slow { slow_ms } else { ms }) * 1000.0) as u64);
    }
    RouterReport {
        router: router.to_owned(),
        reported_at: at,
        p99_ms: h.percentile_ms(99.0),
        count,
        errors: 0,
        histogram: Some(h),
        recent_p99_ms: None,
        recent_count: 0,
    }
}

#[test]
fn the_budget_is_absolute_or_relative_to_the_baseline() {
    assert_eq!(latency_budget_ms(25.0, 1.3, Some(10.0)), Some(25.0));
    assert_eq!(latency_budget_ms(0.0, 1.3, Some(10.0)), Some(13.0));
    assert_eq!(latency_budget_ms(0.0, 1.3, None), None);
    assert_eq!(latency_budget_ms(0.0, 0.0, Some(10.0)), None);
}

#[test]
fn histograms_add_up_and_read_percentiles_within_a_bucket() {
    let mut a = LatencyHistogram::default();
    for ms in 1..=100 {
        a.record(ms * 1000);
    }
    // Nearest rank: the 99th of 100 is 99 ms, read as its bucket's upper bound (≤ 9 % up).
    let p99 = a.percentile_ms(99.0).unwrap();
    assert!((99.0..=99.0 * 1.091).contains(&p99), "{p99}");
    let p50 = a.percentile_ms(50.0).unwrap();
    assert!((50.0..=50.0 * 1.091).contains(&p50), "{p50}");
    // Two routers' intervals pooled: 200 fast and 2 slow operations put the p99 on the
    // fast ones, though one interval alone would read the slow one.
    let mut fast = LatencyHistogram::default();
    for _ in 0..200 {
        fast.record(2_000);
    }
    let mut spiky = LatencyHistogram::default();
    for _ in 0..98 {
        spiky.record(2_000);
    }
    spiky.record(900_000);
    spiky.record(900_000);
    assert!(spiky.percentile_ms(99.0).unwrap() >= 900.0);
    let mut pooled = fast.clone();
    pooled.add(&spiky);
    assert_eq!(pooled.count(), 300);
    assert!(pooled.percentile_ms(99.0).unwrap() < 2.2);
    // Through the report's pairs and back; tiny and huge latencies have a bucket each end.
    assert_eq!(LatencyHistogram::from_pairs(pooled.to_pairs()), pooled);
    let mut ends = LatencyHistogram::default();
    ends.record(0);
    ends.record(u64::MAX / 2);
    assert_eq!(ends.count(), 2);
    assert!(ends.percentile_ms(1.0).unwrap() <= 0.1);
    assert_eq!(LatencyHistogram::default().percentile_ms(99.0), None);
}

#[test]
fn the_window_pools_each_routers_reports_and_the_worst_router_decides() {
    let t0 = Instant::now();
    let s = Duration::from_secs(1);
    let mut w = AppWindow::new(5 * s);
    assert_eq!(w.judge(Some(13.0)), AppHealth::Unknown);
    // Too few operations yet to judge (60 < MIN_APP_SAMPLES).
    assert!(w.observe(&[report("a", 1, 60, 9.0, 0, 0.0)], t0));
    assert_eq!(w.judge(Some(13.0)), AppHealth::Unknown);
    // The same report again is not new; the next one is, and now there is enough.
    assert!(!w.observe(&[report("a", 1, 60, 9.0, 0, 0.0)], t0 + s));
    assert!(w.observe(&[report("a", 2, 150, 9.0, 1, 400.0)], t0 + 2 * s));
    // One slow operation of 210: a single interval's p99 would be 400 ms; pooled, 9 ms.
    assert!(matches!(
        w.judge(Some(13.0)),
        AppHealth::Within { p99_ms, .. } if p99_ms < 10.0
    ));
    // A second router over the budget decides.
    w.observe(
        &[
            report("a", 2, 150, 9.0, 1, 400.0),
            report("b", 7, 300, 9.0, 30, 20.0),
        ],
        t0 + 3 * s,
    );
    assert!(matches!(
        w.judge(Some(13.0)),
        AppHealth::Over { p99_ms, .. } if p99_ms >= 20.0
    ));
    assert_eq!(w.judge(None), AppHealth::Unknown);
    // Reports older than the span leave the window; a router that stopped reporting goes.
    w.observe(&[report("a", 3, 50, 9.0, 0, 0.0)], t0 + 9 * s);
    assert_eq!(w.judge(Some(13.0)), AppHealth::Unknown);
    // Errors count too: 4 of 300 is over 1 %.
    let mut failing = report("c", 1, 300, 1.0, 0, 0.0);
    failing.errors = 4;
    w.observe(&[failing], t0 + 10 * s);
    assert!(matches!(
        w.judge(Some(13.0)),
        AppHealth::Over { error_rate, .. } if error_rate == 4.0 / 300.0
    ));
}

#[test]
fn after_a_restart_each_routers_first_report_is_skipped() {
    let t0 = Instant::now();
    let s = Duration::from_secs(1);
    let mut w = AppWindow::new(5 * s);
    w.observe(&[report("a", 1, 300, 30.0, 0, 0.0)], t0);
    assert!(matches!(w.judge(Some(13.0)), AppHealth::Over { .. }));
    // The rate was cut: the report that covers the cut says nothing of its effect.
    w.restart();
    assert_eq!(w.judge(Some(13.0)), AppHealth::Unknown);
    assert!(!w.observe(&[report("a", 2, 300, 30.0, 0, 0.0)], t0 + s));
    assert_eq!(w.judge(Some(13.0)), AppHealth::Unknown);
    assert!(w.observe(&[report("a", 3, 300, 5.0, 0, 0.0)], t0 + 2 * s));
    assert!(matches!(w.judge(Some(13.0)), AppHealth::Within { .. }));
}

#[test]
fn the_baseline_is_the_worst_routers_recent_p99() {
    let mut a = report("a", 1, 300, 9.0, 0, 0.0);
    a.recent_p99_ms = Some(11.0);
    a.recent_count = 3_000;
    let b = report("b", 1, 300, 14.0, 0, 0.0);
    let mut few = report("c", 1, 10, 500.0, 0, 0.0);
    few.recent_p99_ms = Some(900.0);
    few.recent_count = 10;
    // `b` sends no recent p99: its interval's counts.
    let baseline = app_baseline_ms(&[a.clone(), b, few.clone()]).unwrap();
    assert!((14.0..15.3).contains(&baseline), "{baseline}");
    assert_eq!(app_baseline_ms(&[a, few.clone()]), Some(11.0));
    assert_eq!(app_baseline_ms(&[few]), None);
}

#[test]
fn an_app_over_budget_halves_the_rate_and_recovery_steps_it_back() {
    let t0 = Instant::now();
    let settings = ThrottleSettings {
        max_docs_per_sec: 400.0,
        step_docs_per_sec: 250.0,
        ..ThrottleSettings::default()
    };
    let mut rate = AdaptiveRate::new(settings, t0);
    assert!(rate.on_app_over_budget(t0));
    assert_eq!(rate.applied(), 200.0);
    // Reports within the decrease gap are one signal.
    assert!(!rate.on_app_over_budget(t0 + Duration::from_millis(500)));
    assert!(rate.on_app_over_budget(t0 + Duration::from_secs(2)));
    assert_eq!(rate.applied(), 100.0);
    // Not a capacity signal: the targets did not refuse anything.
    assert!(!rate.overload_window_exceeded(t0 + Duration::from_secs(2), Duration::ZERO));
    // Healthy again: a step per healthy interval, up to the maximum.
    assert_eq!(rate.tick(t0 + Duration::from_secs(7)), 350.0);
    assert_eq!(rate.tick(t0 + Duration::from_secs(12)), 400.0);
}

/// A fake clock: instants are offsets from a fixed origin.
struct Clock(Instant);

impl Clock {
    fn new() -> Self {
        Clock(Instant::now())
    }
    fn at(&self, millis: u64) -> Instant {
        self.0 + Duration::from_millis(millis)
    }
}

fn settings() -> ThrottleSettings {
    ThrottleSettings {
        max_docs_per_sec: 1_000.0,
        min_docs_per_sec: 100.0,
        step_docs_per_sec: 100.0,
        healthy_interval: Duration::from_secs(10),
        target_batch_latency: Duration::from_millis(500),
        decrease_gap: Duration::from_secs(1),
        overload_window: Duration::from_secs(60),
        burst: Duration::from_secs(1),
        ..ThrottleSettings::default()
    }
}

#[test]
fn overload_halves_down_to_the_floor() {
    let clock = Clock::new();
    let mut rate = AdaptiveRate::new(settings(), clock.at(0));
    let mut got = Vec::new();
    for second in 1..=5 {
        rate.on_overload(clock.at(second * 1_000));
        got.push(rate.applied());
    }
    assert_eq!(got, vec![500.0, 250.0, 125.0, 100.0, 100.0]);
}

#[test]
fn overloads_within_the_gap_count_once() {
    let clock = Clock::new();
    let mut rate = AdaptiveRate::new(settings(), clock.at(0));
    assert!(rate.on_overload(clock.at(100)));
    assert!(!rate.on_overload(clock.at(150)));
    assert!(!rate.on_overload(clock.at(900)));
    assert_eq!(rate.applied(), 500.0);
    assert!(rate.on_overload(clock.at(1_100)));
    assert_eq!(rate.applied(), 250.0);
}

#[test]
fn slow_batches_halve_and_fast_ones_do_not() {
    let clock = Clock::new();
    let mut rate = AdaptiveRate::new(settings(), clock.at(0));
    assert!(!rate.on_batch(Duration::from_millis(500), clock.at(1_000)));
    assert_eq!(rate.applied(), 1_000.0);
    assert!(rate.on_batch(Duration::from_millis(501), clock.at(2_000)));
    assert_eq!(rate.applied(), 500.0);
}

#[test]
fn each_healthy_interval_adds_a_step_up_to_the_maximum() {
    let clock = Clock::new();
    let mut rate = AdaptiveRate::new(settings(), clock.at(0));
    rate.on_overload(clock.at(0));
    rate.on_overload(clock.at(1_000));
    assert_eq!(rate.applied(), 250.0);
    // Not a whole interval since the last decrease yet.
    assert_eq!(rate.tick(clock.at(10_999)), 250.0);
    assert_eq!(rate.tick(clock.at(11_000)), 350.0);
    assert_eq!(rate.tick(clock.at(20_999)), 350.0);
    // Three intervals at once add three steps.
    assert_eq!(rate.tick(clock.at(41_000)), 650.0);
    assert_eq!(rate.tick(clock.at(200_000)), 1_000.0);
}

#[test]
fn a_slow_batch_restarts_the_healthy_interval() {
    let clock = Clock::new();
    let mut rate = AdaptiveRate::new(settings(), clock.at(0));
    rate.on_overload(clock.at(0));
    rate.on_batch(Duration::from_secs(1), clock.at(5_000));
    assert_eq!(rate.applied(), 250.0);
    assert_eq!(rate.tick(clock.at(10_000)), 250.0);
    assert_eq!(rate.tick(clock.at(15_000)), 350.0);
}

#[test]
fn sustained_overload_is_a_capacity_signal() {
    let clock = Clock::new();
    let mut rate = AdaptiveRate::new(settings(), clock.at(0));
    let window = Duration::from_secs(60);
    assert!(!rate.overload_window_exceeded(clock.at(0), window));
    // Rejections every 5 s for 70 s.
    for second in (0..=70).step_by(5) {
        rate.on_overload(clock.at(second * 1_000));
        rate.tick(clock.at(second * 1_000));
    }
    assert!(!rate.overload_window_exceeded(clock.at(59_000), window));
    assert!(rate.overload_window_exceeded(clock.at(70_000), window));
    // A healthy interval without rejections ends the run.
    rate.tick(clock.at(80_000));
    assert!(!rate.overload_window_exceeded(clock.at(80_000), window));
    rate.on_overload(clock.at(81_000));
    assert!(!rate.overload_window_exceeded(clock.at(81_000), window));
}

#[test]
fn overload_stops_counting_as_ongoing_after_a_quiet_interval() {
    let clock = Clock::new();
    let mut rate = AdaptiveRate::new(settings(), clock.at(0));
    rate.on_overload(clock.at(0));
    rate.on_overload(clock.at(65_000));
    // 65 s since the first, but the run was broken by a quiet stretch only if tick saw it;
    // without a tick, the last rejection 10 s ago still ends the run.
    assert!(!rate.overload_window_exceeded(clock.at(75_000), Duration::from_secs(60)));
}

#[test]
fn operator_lowers_and_raises_the_maximum() {
    let clock = Clock::new();
    let mut rate = AdaptiveRate::new(settings(), clock.at(0));
    rate.set_max(300.0, clock.at(0));
    assert_eq!(rate.applied(), 300.0);
    rate.set_max(2_000.0, clock.at(0));
    assert_eq!(rate.applied(), 300.0);
    assert_eq!(rate.tick(clock.at(10_000)), 400.0);
    // A maximum below the floor lowers the floor.
    rate.set_max(50.0, clock.at(10_000));
    rate.on_overload(clock.at(10_000));
    assert_eq!(rate.settings().min_docs_per_sec, 50.0);
    assert_eq!(rate.applied(), 50.0);
}

#[test]
fn permits_queue_behind_the_bucket() {
    let clock = Clock::new();
    let mut rate = AdaptiveRate::new(settings(), clock.at(0));
    // A full bucket holds one second at 1,000 docs/s.
    assert_eq!(rate.permit(1_000, clock.at(0)), Duration::ZERO);
    assert_eq!(rate.permit(500, clock.at(0)), Duration::from_millis(500));
    // A second caller queues behind the first.
    assert_eq!(rate.permit(500, clock.at(0)), Duration::from_secs(1));
    // Two seconds later the debt is paid and nothing accumulated beyond it.
    assert_eq!(rate.permit(0, clock.at(2_000)), Duration::ZERO);
    assert_eq!(rate.permit(1_000, clock.at(3_000)), Duration::ZERO);
}

#[test]
fn permits_slow_down_with_the_applied_rate() {
    let clock = Clock::new();
    let mut rate = AdaptiveRate::new(settings(), clock.at(0));
    assert_eq!(rate.permit(1_000, clock.at(0)), Duration::ZERO);
    rate.on_overload(clock.at(0));
    // 500 docs/s now: 1,000 more documents take two seconds.
    assert_eq!(rate.permit(1_000, clock.at(0)), Duration::from_secs(2));
}

#[test]
fn a_quiet_bucket_holds_at_most_a_burst() {
    let clock = Clock::new();
    let mut rate = AdaptiveRate::new(settings(), clock.at(0));
    assert_eq!(rate.permit(0, clock.at(3_600_000)), Duration::ZERO);
    assert_eq!(
        rate.permit(2_000, clock.at(3_600_000)),
        Duration::from_secs(1)
    );
}
