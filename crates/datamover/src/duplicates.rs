//! Commands that reuse a live task's tag, as a target's datamover tells them apart.

use std::collections::HashMap;
use std::sync::Mutex;

/// Tags counted at most (see [`DuplicateCommands`]).
pub const DUPLICATE_TAGS_MAX: usize = 64;

/// A target datamover's count of received commands whose Initiator Task Tag named a task it
/// still held state for (a write's buffer, an iSER command's remote keys).
///
/// Such a command is a duplicate: the session machine rejects it (Task in progress, RFC 7143
/// §11.17.1) and discards it, and the target then calls
/// [`Datamover::discard_command`](crate::Datamover::discard_command) with the same tag — which
/// must free nothing, since what the datamover holds under that tag is the first task's. A
/// datamover that takes no state for a duplicate [`note`](Self::note)s it instead, and a
/// discard that finds it counted [`take`](Self::take)s the count and leaves the task alone. The
/// task's own end ([`Datamover::deallocate_task_resources`](crate::Datamover::deallocate_task_resources))
/// frees it and [`forget`](Self::forget)s the counts: a duplicate still queued behind it (the
/// abort handled first) then names no task.
///
/// Bounded: at most [`DUPLICATE_TAGS_MAX`] tags are counted at once. Beyond that a duplicate is
/// not counted and its discard frees the first task's state: that task fails, in the session of
/// the initiator that broke the rule, and nowhere else.
#[derive(Debug, Default)]
pub struct DuplicateCommands {
    counts: Mutex<HashMap<u32, u32>>,
}

impl DuplicateCommands {
    /// A command with tag `itt` arrived while the datamover held another task's state under
    /// that tag, and took none for it.
    pub fn note(&self, itt: u32) {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        if counts.len() < DUPLICATE_TAGS_MAX || counts.contains_key(&itt) {
            let n = counts.entry(itt).or_default();
            *n = n.saturating_add(1);
        }
    }

    /// The task under `itt` ended (aborted, finished): commands counted as its duplicates now
    /// name no task the datamover holds; their discards (if the session discards them) free
    /// what is held under `itt` then, if anything.
    pub fn forget(&self, itt: u32) {
        self.counts.lock().unwrap_or_else(|e| e.into_inner()).remove(&itt);
    }

    /// A discard of `itt`: `true` if it is a counted duplicate's (the count goes down by
    /// one, and the caller frees nothing).
    pub fn take(&self, itt: u32) -> bool {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        match counts.get_mut(&itt) {
            Some(1) => {
                counts.remove(&itt);
                true
            }
            Some(n) => {
                *n -= 1;
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_noted_duplicate_answers_one_deallocation() {
        let d = DuplicateCommands::default();
        assert!(!d.take(7), "nothing noted: the deallocation frees the task");
        d.note(7);
        d.note(7);
        assert!(d.take(7) && d.take(7), "one deallocation skipped per duplicate");
        assert!(!d.take(7), "then the task's own deallocation frees it");
    }

    #[test]
    fn at_most_the_bound_of_tags_is_counted() {
        let d = DuplicateCommands::default();
        for itt in 0..DUPLICATE_TAGS_MAX as u32 + 10 {
            d.note(itt);
        }
        // At the bound, a tag already counted is counted again...
        d.note(5);
        assert!(d.take(5) && d.take(5) && !d.take(5));
        // ...and a new one is not.
        assert!(d.take(0) && d.take(DUPLICATE_TAGS_MAX as u32 - 1));
        assert!(!d.take(DUPLICATE_TAGS_MAX as u32), "beyond the bound a duplicate is not counted");
    }
}
