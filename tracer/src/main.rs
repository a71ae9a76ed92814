//! The `tracer` binary (see [`tracer::main`]).

// A failed allocation ends tracer with one line naming the memory limit, not an abort.
#[global_allocator]
static ALLOCATOR: tracer::ExitOnOutOfMemory = tracer::ExitOnOutOfMemory;

fn main() {
    tracer::main();
}
