//! Feature `count-allocations`: the binary's allocator wrapped so that it
//! counts every allocation (`alloc`, `alloc_zeroed`, `realloc`), exported
//! as `spoold_allocations_total` on `/metrics` (`api/scrape.rs`). The
//! `pushallocs` section of `bench/run.sh` reads it to give the heap
//! allocations per pushed message. No other build installs it (unit tests
//! compile it to test it): the counter is one relaxed atomic add per
//! allocation, which nothing else should pay.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicU64, Ordering};

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

/// Allocations made by the process since it started.
pub fn total() -> u64 {
    ALLOCATIONS.load(Ordering::Relaxed)
}

/// An allocator that counts the allocations it forwards to `A`.
pub struct Counting<A>(pub A);

// SAFETY: every method forwards to `A` with the caller's arguments
// unchanged; the counter is a side effect only.
#[allow(unsafe_code)]
unsafe impl<A: GlobalAlloc> GlobalAlloc for Counting<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's layout, as `GlobalAlloc::alloc` requires.
        unsafe { self.0.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as for `alloc`.
        unsafe { self.0.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator with this layout.
        unsafe { self.0.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: `ptr` came from this allocator with `layout`; the caller
        // upholds `new_size`'s rules.
        unsafe { self.0.realloc(ptr, layout, new_size) }
    }
}

#[cfg(test)]
#[allow(unsafe_code)]
mod tests {
    use std::alloc::System;

    use super::*;

    #[test]
    fn every_allocation_through_the_wrapper_is_counted_and_frees_are_not() {
        let counting = Counting(System);
        let small = Layout::from_size_align(64, 8).unwrap();
        let large = Layout::from_size_align(128, 8).unwrap();
        let before = total();
        // SAFETY: each pointer comes from `counting` with the layout it
        // is freed or grown with.
        unsafe {
            let p = counting.alloc(small);
            assert!(!p.is_null());
            let p = counting.realloc(p, small, large.size());
            counting.dealloc(p, large);
            let z = counting.alloc_zeroed(small);
            assert_eq!(*z, 0);
            counting.dealloc(z, small);
        }
        assert_eq!(total() - before, 3);
    }
}
