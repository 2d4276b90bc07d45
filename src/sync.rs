//! Locking that survives a panicked holder. Every critical section in this crate is a few map or
//! slot operations that leave the data consistent at each step, so a poisoned lock is still
//! usable, and continuing beats turning one panic into a failure of every later request.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `m`, ignoring poisoning.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
