//! The forger: a process that can reach the store leader and read what any caller may read (Load
//! shows every section's owner incarnation, epoch and ceiling), but never saw an AllocSvr's
//! Register reply. While its fault lasts it sends, every few tens of milliseconds, a Release, a
//! leaving Release, a Renew or a Bump in another incarnation's name, with the section's current
//! epoch and a secret it made up (or none). Each is the attack of issue 25 item 5: a forged
//! `Release{waited: true}` lets the next owner serve at once while the owner still serves from
//! memory (two owners, a step back); a forged Renew keeps a dead incarnation's sections from
//! being reassigned; a forged leaving Release deregisters a live node.
//!
//! With the binding on, the store refuses every one before proposing anything, so the promises
//! hold; with `--unsafe-skip-binding` the checkers catch it.
//!
//! The forger talks to the leader directly and draws from a generator of its own, never from the
//! world's: a forgery the store refuses takes no simulated transit, commits nothing and draws
//! nothing from the seed's generator, so it does not reshuffle the rest of the seed.
//!
//! Deliberately left out: forging Register (a new registration is a new incarnation, not someone
//! else's: that is the identity question TLS answers), data-plane calls, and the moves' admin
//! calls (admin rights, not an incarnation's).

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use seqsvr_proto::pb;

use super::group::{Rep, Req};
use super::world::World;

/// Forges calls to set 0's leader until aborted; `seed` drives what and when.
pub async fn forge(world: Arc<World>, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    loop {
        tokio::time::sleep(Duration::from_millis(rng.random_range(20..200))).await;
        // What Status shows anyone: the leader, the set's parameters, the live incarnations.
        let (leader, sections, step, live) = {
            let st = world.lock();
            let g = &st.groups[0];
            let p = g.set.params.as_ref();
            let live: Vec<u64> = g.set.allocsvrs.keys().map(|i| i.0).collect();
            (
                g.leader(),
                p.map_or(0, |p| p.total_sections()),
                p.map_or(0, |p| p.step),
                live,
            )
        };
        let Some(leader) = leader.filter(|_| sections > 0) else {
            continue;
        };
        let load = Req::Load(pb::LoadRequest {
            sections: vec![pb::SectionRange {
                begin: 0,
                end: sections,
            }],
        });
        let Some(seen) = world
            .deliver(0, leader, &load)
            .await
            .and_then(Rep::take::<pb::LoadReply>)
        else {
            continue;
        };
        let Some(req) = forged(&mut rng, &seen.sections, &live, step) else {
            continue;
        };
        let refused = matches!(world.deliver(0, leader, &req).await, Some(Rep::Error(_)));
        let mut st = world.lock();
        st.forged.sent += 1;
        st.forged.refused += u64::from(refused);
    }
}

/// One forged call about a section Load showed owned by a live incarnation: that incarnation and
/// the section's epoch, with a made-up secret (sometimes none). `None` when no live incarnation
/// owns anything. (A dead owner is left alone: the store answers a call of a gone incarnation as
/// it always did, and such a Release would commit an entry that changes nothing.)
fn forged(rng: &mut StdRng, seen: &[pb::SectionState], live: &[u64], step: u64) -> Option<Req> {
    let owned: Vec<&pb::SectionState> = seen
        .iter()
        .filter(|s| s.owner_incarnation != 0 && live.contains(&s.owner_incarnation))
        .collect();
    if owned.is_empty() {
        return None;
    }
    let s = owned[rng.random_range(0..owned.len())];
    let secret = if rng.random_bool(0.3) {
        Vec::new()
    } else {
        rng.random::<[u8; 16]>().to_vec()
    };
    let (incarnation, epoch) = (s.owner_incarnation, s.epoch);
    let release = |leaving, secret| {
        Req::Release(pb::ReleaseRequest {
            incarnation,
            sections: vec![pb::ReleasedRange {
                begin: s.section,
                end: s.section + 1,
                epoch,
                waited: true,
            }],
            leaving,
            secret,
        })
    };
    Some(match rng.random_range(0..6) {
        0..=2 => release(false, secret),
        3 => release(true, secret),
        // The owner's, or an earlier one's: a dead incarnation kept alive by forged renewals
        // would keep its sections from being reassigned.
        4 => Req::Renew(pb::RenewRequest {
            incarnation: incarnation.saturating_sub(rng.random_range(0..3)).max(1),
            route_version: 0,
            map_version: 0,
            secret,
            // A forged renewal that got through would also hoard id slots.
            id_slots_wanted: rng.random_range(0..100),
            version: String::new(),
        }),
        _ => Req::Bump(pb::BumpRequest {
            incarnation,
            items: vec![pb::BumpItem {
                section: s.section,
                epoch,
                new_max: s.max_seq.saturating_add(step.saturating_mul(rng.random_range(1..=4))),
            }],
            secret,
        }),
    })
}
