// Implementation of ds::aio::AioHandle (see ds/aio.h for the behaviour).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "ds/aio.h"

namespace ds::aio {

struct AioHandle::Op {
  OpResult result;
  char* buffer = nullptr;
  int fd_direct = -1;
  int fd_buffered = -1;
  int64_t direct_len = 0;   // [0, direct_len) goes through fd_direct
  int64_t direct_block = 0;
  int64_t num_direct_blocks = 0;
  int64_t num_blocks = 0;
  std::atomic<int64_t> tasks_left{0};
  std::atomic<int64_t> bytes_done{0};
  std::atomic<int64_t> direct_bytes{0};
  std::atomic<bool> direct_refused{false};
  bool async = true;
  std::mutex err_mu;

  void fail(int err, const std::string& what) {
    std::lock_guard<std::mutex> lk(err_mu);
    if (result.error != 0) return;  // keep the first failure
    result.error = err;
    result.message = what;
  }
  bool failed() {
    std::lock_guard<std::mutex> lk(err_mu);
    return result.error != 0;
  }
};

namespace {

std::string describe(const OpResult& r, int64_t pos, const std::string& why) {
  return std::string(r.write ? "write to " : "read from ") + r.path + " at byte " +
         std::to_string(r.offset + pos) + " failed: " + why;
}

int open_file(const std::string& path, bool write, bool direct) {
  int flags = (write ? (O_WRONLY | O_CREAT) : O_RDONLY) | O_CLOEXEC;
  if (direct) flags |= O_DIRECT;
  int fd;
  do {
    fd = ::open(path.c_str(), flags, 0644);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

}  // namespace

AioHandle::AioHandle(const AioConfig& cfg)
    : cfg_(cfg), pool_(std::max(1, cfg.intra_op_parallelism)) {
  if (cfg_.block_size <= 0 || cfg_.queue_depth <= 0 || cfg_.intra_op_parallelism <= 0)
    throw std::invalid_argument("block_size, queue_depth and intra_op_parallelism must be > 0");
}

AioHandle::~AioHandle() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [this] { return in_flight_ == 0; });
}

int64_t AioHandle::submit(bool write, char* buffer, int64_t nbytes, const std::string& path,
                          int64_t offset, bool collected_by_wait_all) {
  auto op = std::make_shared<Op>();
  op->async = collected_by_wait_all;
  op->buffer = buffer;
  op->result.write = write;
  op->result.path = path;
  op->result.offset = offset;
  op->result.nbytes = nbytes;
  {
    std::unique_lock<std::mutex> lk(mu_);
    const int64_t limit = cfg_.overlap_events ? cfg_.queue_depth : 1;
    cv_.wait(lk, [&] { return in_flight_ < limit; });
    op->result.id = next_id_++;
    pending_.insert(op->result.id);
    ++in_flight_;
    if (op->async) ++in_flight_async_;
  }

  // Direct I/O needs the address, the file offset and the length in whole 4 KiB units.
  const bool aligned = reinterpret_cast<uintptr_t>(buffer) % kDirectAlign == 0 &&
                       offset % kDirectAlign == 0 && nbytes >= kDirectAlign;
  if (cfg_.use_o_direct && aligned) {
    op->fd_direct = open_file(path, write, true);
    if (op->fd_direct < 0 && errno != EINVAL) {
      op->fail(errno, describe(op->result, 0, std::strerror(errno)));
    } else if (op->fd_direct >= 0) {
      op->direct_len = nbytes / kDirectAlign * kDirectAlign;
    }
  }
  if (!op->failed()) {
    op->fd_buffered = open_file(path, write, false);
    if (op->fd_buffered < 0) op->fail(errno, describe(op->result, 0, std::strerror(errno)));
  }
  if (op->failed() || nbytes == 0) {
    op->tasks_left = 1;
    finish(op);
    return op->result.id;
  }

  const int64_t bs = cfg_.block_size;
  op->direct_block = (bs + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
  op->num_direct_blocks = (op->direct_len + op->direct_block - 1) / op->direct_block;
  op->num_blocks = op->num_direct_blocks + (nbytes - op->direct_len + bs - 1) / bs;
  const int64_t nb = op->num_blocks;
  const int64_t id = op->result.id;
  if (cfg_.single_submit) {
    op->tasks_left = nb;
    for (int64_t b = 0; b < nb; ++b) pool_.submit([this, op, b] { run_blocks(op, b, b + 1); });
  } else {
    const int64_t parts = std::min<int64_t>(nb, cfg_.intra_op_parallelism);
    op->tasks_left = parts;
    for (int64_t p = 0; p < parts; ++p) {
      const int64_t b0 = nb * p / parts, b1 = nb * (p + 1) / parts;
      pool_.submit([this, op, b0, b1] { run_blocks(op, b0, b1); });
    }
  }
  return id;
}

void AioHandle::run_blocks(const std::shared_ptr<Op>& op, int64_t b0, int64_t b1) {
  const bool write = op->result.write;
  for (int64_t b = b0; b < b1 && !op->failed(); ++b) {
    int64_t start, len;
    bool direct = b < op->num_direct_blocks;
    if (direct) {
      start = b * op->direct_block;
      len = std::min(op->direct_block, op->direct_len - start);
    } else {
      const int64_t k = b - op->num_direct_blocks;
      start = op->direct_len + k * cfg_.block_size;
      len = std::min(cfg_.block_size, op->result.nbytes - start);
    }
    if (direct && op->direct_refused.load()) direct = false;
    int64_t pos = 0;
    while (pos < len) {
      const int fd = direct ? op->fd_direct : op->fd_buffered;
      char* p = op->buffer + start + pos;
      const off_t at = static_cast<off_t>(op->result.offset + start + pos);
      const size_t want = static_cast<size_t>(len - pos);
      const ssize_t r = write ? ::pwrite(fd, p, want, at) : ::pread(fd, p, want, at);
      if (r < 0) {
        if (errno == EINTR) continue;
        if (direct && errno == EINVAL) {  // filesystem accepted the open but not the transfer
          op->direct_refused = true;
          direct = false;
          continue;
        }
        op->fail(errno, describe(op->result, start + pos, std::strerror(errno)));
        break;
      }
      if (r == 0) {
        if (write) {
          op->fail(ENOSPC, describe(op->result, start + pos, "the device accepted no bytes"));
        } else {
          op->fail(-1, describe(op->result, start + pos,
                                "short read: the file ends before " +
                                    std::to_string(op->result.offset + op->result.nbytes) +
                                    " bytes"));
        }
        break;
      }
      pos += r;
      op->bytes_done += r;
      if (direct) op->direct_bytes += r;
      // A partial direct transfer leaves an unaligned remainder: finish it buffered.
      if (direct && pos < len) direct = false;
    }
  }
  if (--op->tasks_left == 0) finish(op);
}

void AioHandle::finish(const std::shared_ptr<Op>& op) {
  if (op->fd_direct >= 0) ::close(op->fd_direct);
  if (op->fd_buffered >= 0 && ::close(op->fd_buffered) != 0 && op->result.write)
    op->fail(errno, describe(op->result, 0, std::string("close: ") + std::strerror(errno)));
  op->result.bytes_done = op->bytes_done.load();
  op->result.direct_bytes = op->direct_bytes.load();
  {
    std::lock_guard<std::mutex> lk(mu_);
    pending_.erase(op->result.id);
    (op->async ? done_ : done_sync_).emplace(op->result.id, op->result);
    --in_flight_;
    if (op->async) --in_flight_async_;
  }
  cv_.notify_all();
}

OpResult AioHandle::wait_op(int64_t id) {
  std::unique_lock<std::mutex> lk(mu_);
  if (pending_.count(id) == 0 && done_.count(id) == 0 && done_sync_.count(id) == 0)
    throw std::invalid_argument("operation " + std::to_string(id) + " is unknown or collected");
  cv_.wait(lk, [&] { return done_.count(id) != 0 || done_sync_.count(id) != 0; });
  auto& from = done_.count(id) != 0 ? done_ : done_sync_;
  OpResult r = std::move(from.at(id));
  from.erase(id);
  return r;
}

std::vector<OpResult> AioHandle::wait_all() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [this] { return in_flight_async_ == 0; });
  std::vector<OpResult> out;
  out.reserve(done_.size());
  for (auto& kv : done_) out.push_back(std::move(kv.second));
  done_.clear();
  return out;
}

int64_t AioHandle::in_flight() {
  std::lock_guard<std::mutex> lk(mu_);
  return in_flight_;
}

}  // namespace ds::aio
