//! Where the background tasks of the client and the server run: an [`Executor`], as hyper's
//! `rt::Executor`, with [`TokioExecutor`] as the default.

use std::fmt;
use std::sync::Arc;

use meshkit_identity::BoxFuture;

/// Runs the tasks that the client and the server start in the background: the driver of each
/// pooled client connection (HTTP/2, keepalive PINGs, idle close), and on the server each
/// accepted connection and each CONNECT stream.
///
/// An executor must run every future it is given to completion, concurrently with the caller,
/// on a runtime with tokio's time and I/O drivers enabled (the futures use tokio timers and
/// sockets). Dropping a future instead closes what it drives: a client connection leaves the
/// pool, a server connection or stream is reset.
///
/// Set with [`ClientConfig::with_executor`](crate::ClientConfig::with_executor) and
/// [`ServerConfig::with_executor`](crate::ServerConfig::with_executor); the default is
/// [`TokioExecutor`].
///
/// # Example
///
/// An executor that counts the tasks it starts and runs them on tokio:
///
/// ```
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use meshkit_hbone::{BoxFuture, ClientConfig, Executor};
///
/// #[derive(Default)]
/// struct Counting(AtomicUsize);
///
/// impl Executor for Counting {
///     fn execute(&self, task: BoxFuture<'static, ()>) {
///         self.0.fetch_add(1, Ordering::Relaxed);
///         tokio::spawn(task);
///     }
/// }
///
/// let executor = Arc::new(Counting::default());
/// let config = ClientConfig::default().with_executor(executor.clone());
/// # let _ = config;
/// ```
pub trait Executor: Send + Sync + 'static {
    /// Starts `task` in the background.
    fn execute(&self, task: BoxFuture<'static, ()>);
}

/// The default [`Executor`]: `tokio::spawn`, on the runtime of the task that starts the
/// background task (the one that calls `Client::open` or runs the server).
///
/// # Panics
///
/// [`Executor::execute`] panics outside a tokio runtime, as `tokio::spawn` does.
#[derive(Debug, Clone, Copy, Default)]
pub struct TokioExecutor;

impl Executor for TokioExecutor {
    fn execute(&self, task: BoxFuture<'static, ()>) {
        tokio::spawn(task);
    }
}

/// Spawns on the runtime of this handle, wherever the caller runs.
impl Executor for tokio::runtime::Handle {
    fn execute(&self, task: BoxFuture<'static, ()>) {
        self.spawn(task);
    }
}

impl<E: Executor + ?Sized> Executor for Arc<E> {
    fn execute(&self, task: BoxFuture<'static, ()>) {
        (**self).execute(task)
    }
}

/// The largest future spawned on tokio as it is; larger ones are boxed first (see
/// [`Exec::execute`]).
const INLINE_TASK: usize = 512;

/// The executor of a configuration: `None` is [`TokioExecutor`], so that default
/// configurations compare equal.
#[derive(Clone, Default)]
pub(crate) struct Exec(Option<Arc<dyn Executor>>);

// === impl Exec ===

impl Exec {
    pub(crate) fn new(executor: impl Executor) -> Self {
        Self(Some(Arc::new(executor)))
    }

    pub(crate) fn execute<F: Future<Output = ()> + Send + 'static>(&self, task: F) {
        match &self.0 {
            Some(executor) => executor.execute(Box::pin(task)),
            // tokio keeps a task's future inline in the task and copies all of it when the
            // task is created and at each change of its stage (done, output taken); it boxes
            // only futures past 16 KiB (2 KiB with debug assertions). The connection tasks are
            // kilobytes (a rustls connection, h2's, their timers): boxed here once, what tokio
            // copies is a pointer.
            None if std::mem::size_of::<F>() > INLINE_TASK => {
                tokio::spawn(Box::pin(task));
            }
            None => {
                tokio::spawn(task);
            }
        }
    }
}

impl fmt::Debug for Exec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(_) => f.write_str("Executor"),
            None => f.write_str("TokioExecutor"),
        }
    }
}

/// Equal when both are the default or both are the same executor.
impl PartialEq for Exec {
    fn eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl Eq for Exec {}
