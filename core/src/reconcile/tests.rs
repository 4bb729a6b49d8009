//! The reconciler driven against a real pool document; time jumps, nothing sleeps.

use super::*;
use crate::pool::{PoolConfig, PoolDoc, RemovalReason, StateKind, WorkerState};
use crate::reset::ResetEvidence;

const DEPLOY_OFFSET_MS: u64 = 1_000_000;

/// A store holding one pool document, and a backend whose workers exist as a set.
struct Shell {
    doc: Option<PoolDoc>,
    pool: PoolConfig,
    mono: MonoMillis,
    store_up: bool,
    backend: BTreeSet<WorkerId>,
    /// Every store call answered, in order.
    calls: Vec<StoreCall>,
}

impl Shell {
    fn new(pool: PoolConfig) -> Self {
        Self {
            doc: None,
            pool,
            mono: MonoMillis(0),
            store_up: true,
            backend: BTreeSet::new(),
            calls: Vec::new(),
        }
    }

    fn deploy_now(&self) -> UnixMillis {
        UnixMillis(DEPLOY_OFFSET_MS + self.mono.0)
    }

    fn doc(&self) -> &PoolDoc {
        self.doc.as_ref().expect("a document")
    }

    /// Answers every store call the reconciler has, at once; returns the work it handed out.
    fn drain(&mut self, reconciler: &mut Reconciler) -> Vec<Work> {
        let mut work = Vec::new();
        loop {
            work.extend(std::iter::from_fn(|| reconciler.poll_effect()));
            let Some(call) = reconciler.poll_command() else {
                break;
            };
            self.calls.push(call.clone());
            match call {
                StoreCall::ReadImage => {
                    let image = if self.store_up {
                        Ok(self.doc.as_ref().and_then(|d| d.image().cloned()))
                    } else {
                        Err(Unavailable)
                    };
                    reconciler.handle_image(image, self.mono);
                }
                StoreCall::Commit(command) => {
                    let answer = self.store_up.then(|| {
                        let now = self.deploy_now();
                        let doc = self.doc.get_or_insert_with(|| PoolDoc::new(1, now));
                        doc.apply(command, now, &self.pool)
                    });
                    reconciler.handle_committed(answer, self.mono);
                }
            }
        }
        work
    }

    /// Performs a listing, a create, a delete or a reset at once and answers it.
    fn perform(&mut self, reconciler: &mut Reconciler, work: Work) {
        match work {
            Work::List => {
                let listed = Ok((self.deploy_now(), self.backend.clone()));
                reconciler.handle_listed(listed, self.mono);
            }
            Work::Create { worker, token, .. } => {
                self.backend.insert(worker);
                reconciler.handle_created(worker, token, Outcome::Done, self.mono);
            }
            Work::Delete { worker, token } => {
                self.backend.remove(&worker);
                reconciler.handle_deleted(worker, token, Outcome::Done, self.mono);
            }
            Work::Reset { worker, token } => {
                let evidence = Some(ResetEvidence::clean(token));
                reconciler.handle_reset(worker, token, evidence, self.mono);
            }
        }
    }

    /// Drains and performs everything until nothing more comes out.
    fn settle(&mut self, reconciler: &mut Reconciler) {
        for _ in 0..64 {
            let work = self.drain(reconciler);
            if work.is_empty() {
                return;
            }
            for item in work {
                self.perform(reconciler, item);
            }
        }
        panic!("the reconciler never settled");
    }

    fn advance_to(&mut self, reconciler: &mut Reconciler, at: MonoMillis) {
        self.mono = at;
        reconciler.handle_timeout(at);
    }
}

fn pool_config() -> PoolConfig {
    PoolConfig {
        warm_min: 2,
        target_idle: 1,
        max_allocated: 4,
        max_concurrent_creates: 3,
        ..PoolConfig::default()
    }
}

fn image() -> ImageId {
    ImageId("img-2".into())
}

fn events(reconciler: &mut Reconciler) -> Vec<ReconcilerEvent> {
    std::iter::from_fn(|| reconciler.poll_event()).collect()
}

fn kind_of(call: &StoreCall) -> &'static str {
    match call {
        StoreCall::ReadImage => "read_image",
        StoreCall::Commit(Command::PublishImage { .. }) => "publish",
        StoreCall::Commit(Command::InventoryObserved { .. }) => "inventory",
        StoreCall::Commit(Command::Tick { .. }) => "tick",
        StoreCall::Commit(Command::CreateReported { .. }) => "create_reported",
        StoreCall::Commit(Command::DeleteReported { .. }) => "delete_reported",
        StoreCall::Commit(Command::ResetReported { .. }) => "reset_reported",
        StoreCall::Commit(_) => "other",
    }
}

#[test]
fn pool_12_a_pass_reads_publishes_lists_reports_and_ticks_in_that_order() {
    let mut shell = Shell::new(pool_config());
    let mut reconciler = Reconciler::new(image(), ReconcilerConfig::default(), MonoMillis(0));
    assert_eq!(
        shell.drain(&mut reconciler),
        Vec::new(),
        "nothing before the pass is due"
    );
    shell.advance_to(&mut reconciler, MonoMillis(0));
    let work = shell.drain(&mut reconciler);
    assert_eq!(work, vec![Work::List]);
    shell.perform(&mut reconciler, Work::List);
    let work = shell.drain(&mut reconciler);
    let kinds: Vec<&str> = shell.calls.iter().map(kind_of).collect();
    assert_eq!(kinds, ["read_image", "publish", "inventory", "tick"]);
    assert_eq!(work.len(), 2, "the warm minimum: {work:?}");
    assert!(
        work.iter()
            .all(|w| matches!(w, Work::Create { image: i, .. } if *i == image()))
    );
    assert_eq!(
        events(&mut reconciler),
        vec![ReconcilerEvent::PassEnded(PassSummary {
            coordinated: true,
            published: true,
            observed: true,
            effects_started: 2,
            effects_dropped: 0,
        })]
    );
    assert_eq!(reconciler.poll_timeout(), Some(MonoMillis(500)));
}

#[test]
fn pool_12_a_pass_that_finds_its_image_published_does_not_publish_again() {
    let mut shell = Shell::new(pool_config());
    let mut reconciler = Reconciler::new(image(), ReconcilerConfig::default(), MonoMillis(0));
    shell.advance_to(&mut reconciler, MonoMillis(0));
    shell.settle(&mut reconciler);
    shell.calls.clear();
    shell.advance_to(&mut reconciler, MonoMillis(500));
    shell.settle(&mut reconciler);
    let kinds: Vec<&str> = shell.calls.iter().map(kind_of).collect();
    assert_eq!(kinds, ["read_image", "inventory", "tick"]);
    assert_eq!(shell.doc().counts().warm, 2);
}

#[test]
fn pool_11_without_the_store_a_pass_does_nothing_at_all() {
    let mut shell = Shell::new(pool_config());
    shell.store_up = false;
    let mut reconciler = Reconciler::new(image(), ReconcilerConfig::default(), MonoMillis(0));
    shell.advance_to(&mut reconciler, MonoMillis(0));
    let work = shell.drain(&mut reconciler);
    assert_eq!(work, Vec::new(), "no listing, no create, no delete");
    assert_eq!(shell.calls, vec![StoreCall::ReadImage]);
    assert!(shell.doc.is_none());
    assert_eq!(
        events(&mut reconciler),
        vec![ReconcilerEvent::PassEnded(PassSummary::default())]
    );
    assert_eq!(reconciler.poll_timeout(), Some(MonoMillis(500)));
}

#[test]
fn creates_are_reported_and_the_pool_warms() {
    let mut shell = Shell::new(pool_config());
    let mut reconciler = Reconciler::new(image(), ReconcilerConfig::default(), MonoMillis(0));
    shell.advance_to(&mut reconciler, MonoMillis(0));
    shell.settle(&mut reconciler);
    let reported = shell
        .calls
        .iter()
        .filter(|c| kind_of(c) == "create_reported")
        .count();
    assert_eq!(reported, 2);
    assert_eq!(shell.doc().counts().warm, 2);
    assert_eq!(reconciler.calls_out(), 0);
}

#[test]
fn pool_10_a_create_without_an_answer_is_reported_unknown_at_its_deadline() {
    let mut shell = Shell::new(pool_config());
    let config = ReconcilerConfig {
        call_timeout_ms: 3_000,
        ..ReconcilerConfig::default()
    };
    let mut reconciler = Reconciler::new(image(), config, MonoMillis(0));
    shell.advance_to(&mut reconciler, MonoMillis(0));
    let _ = shell.drain(&mut reconciler);
    shell.perform(&mut reconciler, Work::List);
    let creates = shell.drain(&mut reconciler);
    assert_eq!(creates.len(), 2);
    // The backend never answers. Passes go on meanwhile.
    loop {
        let at = reconciler.poll_timeout().expect("a timer");
        if at >= MonoMillis(3_000) {
            assert_eq!(at, MonoMillis(3_000), "the creates' deadline is a timer");
            break;
        }
        shell.advance_to(&mut reconciler, at);
        for work in shell.drain(&mut reconciler) {
            assert_eq!(work, Work::List, "no create is started twice");
            shell.perform(&mut reconciler, work);
        }
    }
    shell.advance_to(&mut reconciler, MonoMillis(3_000));
    let deletes = shell.drain(&mut reconciler);
    assert_eq!(
        deletes.len(),
        2,
        "each ambiguous create is deleted: {deletes:?}"
    );
    for work in creates {
        let Work::Create { worker, .. } = work else {
            panic!("{work:?}");
        };
        let state = &shell.doc().workers()[&worker].state;
        assert!(
            matches!(state, WorkerState::Quarantined(r) if r.reason == RemovalReason::AmbiguousCreate),
            "{worker}: {state:?}"
        );
    }
}

#[test]
fn pool_12_after_an_outage_reports_wait_until_a_pass_has_read_the_store() {
    let mut shell = Shell::new(pool_config());
    let mut reconciler = Reconciler::new(image(), ReconcilerConfig::default(), MonoMillis(0));
    shell.advance_to(&mut reconciler, MonoMillis(0));
    let _ = shell.drain(&mut reconciler);
    shell.perform(&mut reconciler, Work::List);
    let creates = shell.drain(&mut reconciler);
    // The store goes away; the first create's report gets no answer.
    shell.store_up = false;
    let mut creates = creates.into_iter();
    let Some(first) = creates.next() else {
        panic!("creates expected");
    };
    shell.perform(&mut reconciler, first);
    let _ = shell.drain(&mut reconciler);
    assert_eq!(
        shell.calls.last().map(kind_of),
        Some("create_reported"),
        "the report was tried"
    );
    // The store is back. The second create's report waits: the next pass reads the store first.
    shell.store_up = true;
    shell.calls.clear();
    for work in creates {
        shell.perform(&mut reconciler, work);
    }
    let _ = shell.drain(&mut reconciler);
    assert_eq!(
        shell.calls,
        Vec::new(),
        "nothing goes to the store before the pass"
    );
    shell.advance_to(&mut reconciler, MonoMillis(500));
    shell.settle(&mut reconciler);
    let kinds: Vec<&str> = shell.calls.iter().map(kind_of).collect();
    assert_eq!(kinds[0], "read_image", "{kinds:?}");
    assert_eq!(
        kinds.iter().filter(|k| **k == "create_reported").count(),
        2,
        "both reports go once the store was read: {kinds:?}"
    );
    assert_eq!(shell.doc().counts().warm, 2);
}

#[test]
fn the_budget_bounds_the_effects_of_one_pass() {
    let mut shell = Shell::new(PoolConfig {
        warm_min: 4,
        max_concurrent_creates: 4,
        ..pool_config()
    });
    let config = ReconcilerConfig {
        pass_effects_max: 3,
        ..ReconcilerConfig::default()
    };
    let mut reconciler = Reconciler::new(image(), config, MonoMillis(0));
    shell.advance_to(&mut reconciler, MonoMillis(0));
    let _ = shell.drain(&mut reconciler);
    shell.perform(&mut reconciler, Work::List);
    let work = shell.drain(&mut reconciler);
    assert_eq!(work.len(), 3, "three of the four creates: {work:?}");
    let Some(ReconcilerEvent::PassEnded(summary)) = reconciler.poll_event() else {
        panic!("the pass ended");
    };
    assert_eq!(summary.effects_started, 3);
    assert_eq!(summary.effects_dropped, 1);
    assert_eq!(shell.doc().counts().creating, 4, "the pool ordered four");
}

#[test]
fn an_effect_handed_over_twice_is_performed_once() {
    let mut shell = Shell::new(pool_config());
    let mut reconciler = Reconciler::new(image(), ReconcilerConfig::default(), MonoMillis(0));
    shell.advance_to(&mut reconciler, MonoMillis(0));
    shell.settle(&mut reconciler);
    let (worker, token) = shell
        .doc()
        .workers()
        .iter()
        .find(|(_, w)| w.state.kind() == StateKind::Warm)
        .map(|(id, w)| (*id, w.token))
        .expect("a warm worker");
    reconciler.handle_handoff(Effect::Delete { worker, token }, shell.mono);
    reconciler.handle_handoff(Effect::Delete { worker, token }, shell.mono);
    let work = shell.drain(&mut reconciler);
    assert_eq!(work, vec![Work::Delete { worker, token }]);
}

#[test]
fn spurious_timeouts_and_answers_change_nothing() {
    let mut shell = Shell::new(pool_config());
    let mut reconciler = Reconciler::new(image(), ReconcilerConfig::default(), MonoMillis(100));
    reconciler.handle_timeout(MonoMillis(50));
    reconciler.handle_committed(None, MonoMillis(50));
    reconciler.handle_image(Ok(None), MonoMillis(50));
    reconciler.handle_listed(Err(Unavailable), MonoMillis(50));
    reconciler.handle_created(
        WorkerId { epoch: 1, seq: 9 },
        OpToken(9),
        Outcome::Done,
        MonoMillis(50),
    );
    assert_eq!(shell.drain(&mut reconciler), Vec::new());
    assert_eq!(shell.calls, Vec::new());
    assert_eq!(reconciler.poll_timeout(), Some(MonoMillis(100)));
}
