//! How many bytes a scan's prefetches may hold: the controller's budget for the scan, and,
//! when the session's memory pool is bounded, at most half the pool for all prefetching
//! together, since prefetched bytes cannot be given back once an operator needs memory.
//! Every byte is reserved in the pool before its download starts.

use datafusion::execution::memory_pool::MemoryLimit;

use super::Scan;
use super::queue::State;

impl Scan {
    /// Reserves `bytes` for a download, within the scan's byte budget and the memory pool.
    pub(super) fn reserve(&self, state: &mut State, bytes: u64) -> bool {
        state.controller.saw(bytes);
        let budget = state.controller.budget();
        let Some(reservation) = state.reservation.as_mut() else {
            return false;
        };
        let before = reservation.size() as u64;
        if before + bytes > budget {
            return false;
        }
        let over_half = match self.pool.memory_limit() {
            MemoryLimit::Finite(limit) => {
                self.figures.global().reserved() + bytes > limit as u64 / 2
            }
            _ => false,
        };
        if over_half || reservation.try_grow(bytes as usize).is_err() {
            self.figures.denied();
            log::debug!(
                "prefetch: the memory pool refused {bytes} bytes ({} reserved by prefetching)",
                self.figures.global().reserved()
            );
            return false;
        }
        self.figures.reserved(before, before + bytes);
        true
    }

    /// Gives back `bytes` of the scan's reservation.
    pub(super) fn release(&self, state: &mut State, bytes: u64) {
        if let Some(reservation) = state.reservation.as_mut() {
            let before = reservation.size() as u64;
            let bytes = bytes.min(before);
            reservation.shrink(bytes as usize);
            self.figures.reserved(before, before - bytes);
        }
    }
}
