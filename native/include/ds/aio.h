// Block-wise parallel file I/O for NVMe offload and checkpoint writes.
//
// Each operation (one buffer, one file, one offset) is split into blocks of block_size bytes that
// a private pool of intra_op_parallelism threads reads or writes with pread/pwrite. When the
// buffer address, file offset and length allow it (4096-byte alignment), the aligned part goes
// through an O_DIRECT descriptor; filesystems that refuse O_DIRECT (EINVAL on open or on the first
// transfer) fall back to buffered I/O for that operation, as does any unaligned tail.
//
// Operations complete asynchronously; failures are recorded with errno and the path and reported
// by wait()/wait_op(), never thrown from a worker.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "ds/thread_pool.h"

namespace ds::aio {

inline constexpr int64_t kDirectAlign = 4096;

struct AioConfig {
  int64_t block_size = 1 << 20;
  int queue_depth = 8;             // operations in flight before submit() blocks
  int intra_op_parallelism = 1;    // I/O threads of this handle
  bool single_submit = false;      // one pool task per block instead of one per thread slice
  bool overlap_events = true;      // false: an operation starts only after the previous finished
  bool use_o_direct = true;
};

struct OpResult {
  int64_t id = 0;
  bool write = false;
  std::string path;
  int64_t offset = 0;
  int64_t nbytes = 0;
  int64_t bytes_done = 0;
  int error = 0;            // errno of the first failure, 0 on success (-1: short read)
  std::string message;      // what failed, empty on success
  int64_t direct_bytes = 0; // bytes transferred through the O_DIRECT descriptor
};

class AioHandle {
 public:
  explicit AioHandle(const AioConfig& cfg);
  ~AioHandle();  // waits for every submitted operation
  AioHandle(const AioHandle&) = delete;
  AioHandle& operator=(const AioHandle&) = delete;

  // Starts an operation and returns its id; blocks while queue_depth operations are in flight
  // (or, without overlap_events, until the previous one finished).
  // Results of `collected_by_wait_all` operations are returned by wait_all(); the others only
  // by wait_op(id), so a synchronous call never loses its result to a concurrent wait_all().
  int64_t submit(bool write, char* buffer, int64_t nbytes, const std::string& path,
                 int64_t offset, bool collected_by_wait_all);
  // Blocks until operation `id` finished and returns (and forgets) its result.
  OpResult wait_op(int64_t id);
  // Blocks until every wait_all-collected operation finished; returns their results not yet
  // collected by wait_op.
  std::vector<OpResult> wait_all();
  int64_t in_flight();
  const AioConfig& config() const { return cfg_; }

 private:
  struct Op;
  void run_blocks(const std::shared_ptr<Op>& op, int64_t b0, int64_t b1);
  void finish(const std::shared_ptr<Op>& op);

  AioConfig cfg_;
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t next_id_ = 0;
  int64_t in_flight_ = 0;        // all operations
  int64_t in_flight_async_ = 0;  // those collected by wait_all
  std::set<int64_t> pending_;
  std::map<int64_t, OpResult> done_;        // finished, collected by wait_all or wait_op
  std::map<int64_t, OpResult> done_sync_;   // finished, collected by wait_op only
  ThreadPool pool_;  // last member: joined first, while the state above is still alive
};

}  // namespace ds::aio
