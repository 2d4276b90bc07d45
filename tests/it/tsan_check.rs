//! A self-check for `scripts/sanitizers.sh`: under ThreadSanitizer this deliberate data race
//! must be reported, which shows that a clean TSan run of the other tests means something. Never
//! run otherwise (`#[ignore]`): the race is undefined behaviour by design.

use std::cell::UnsafeCell;

struct Racy(UnsafeCell<u64>);
// SAFETY: deliberately false, for the self-check only.
unsafe impl Sync for Racy {}

#[test]
#[ignore = "deliberate data race; run by scripts/sanitizers.sh under TSan, which must report it"]
fn tsan_self_check_a_deliberate_race_is_reported() {
    let shared = Racy(UnsafeCell::new(0));
    let barrier = std::sync::Barrier::new(2);
    std::thread::scope(|s| {
        for i in 0..2u64 {
            let (shared, barrier) = (&shared, &barrier);
            s.spawn(move || {
                barrier.wait();
                for n in 0..1000 {
                    // SAFETY: none; two threads write without synchronisation on purpose.
                    unsafe { std::ptr::write_volatile(shared.0.get(), i * 1000 + n) };
                }
            });
        }
    });
}
