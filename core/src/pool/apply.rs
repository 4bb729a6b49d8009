//! The transition: one `match` over the command, one arm per case. Each arm's rule lives in the
//! module named for what it decides: [`super::lease`], [`super::report`], [`super::tick`].

use super::config::PoolConfig;
use super::doc::{Applied, Command, PoolDoc, Ticket};
use crate::time::UnixMillis;

impl PoolDoc {
    /// Applies one command at deployment time `now`. A refused command changes nothing but the
    /// housekeeping every command does (expiring tickets whose deadline passed).
    pub fn apply(&mut self, command: Command, now: UnixMillis, config: &PoolConfig) -> Applied {
        let now = now.max(self.clock);
        self.clock = now;
        let mut out = Applied::default();
        // No ticket outlives its deadline, whatever the command (so none is granted after it).
        self.expire_tickets(now, config, &mut out);
        match command {
            Command::Acquire {
                ticket,
                member,
                scope,
                wait_ms,
                stack,
            } => {
                let ticket = Ticket {
                    id: ticket,
                    member,
                    scope,
                    deadline: now.plus_ms(wait_ms.min(config.acquire_wait_ms)),
                    stack,
                };
                self.acquire(ticket, now, config, &mut out);
            }
            Command::Cancel { ticket } => self.cancel(ticket, now, config, &mut out),
            Command::Heartbeat {
                worker,
                lease,
                token,
            } => self.heartbeat(worker, lease, token, now, config, &mut out),
            Command::Release {
                worker,
                lease,
                token,
                disposition,
            } => {
                self.release(worker, lease, token, disposition, now, config, &mut out);
            }
            Command::CreateReported {
                worker,
                token,
                outcome,
            } => {
                self.create_reported(worker, token, outcome, now, config, &mut out);
            }
            Command::ResetReported {
                worker,
                token,
                evidence,
            } => {
                self.reset_reported(worker, token, &evidence, now, config, &mut out);
            }
            Command::DeleteReported {
                worker,
                token,
                outcome,
            } => {
                self.delete_reported(worker, token, outcome, now, config, &mut out);
            }
            Command::PublishImage { image } => self.publish_image(image, now, config, &mut out),
            Command::InventoryObserved { as_of, present } => {
                self.inventory_observed(as_of, &present, now, config, &mut out)
            }
            Command::Tick { image } => self.tick(&image, now, config, &mut out),
        }
        if !config.any_broken() {
            self.invariants(config);
        }
        out
    }
}
