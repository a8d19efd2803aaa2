// A cache of freed large CPU blocks in front of torch's CPU allocator (see allocator.py for why).
//
// Blocks of at least `min_bytes` are thinkrl's own (posix_memalign, 64-byte aligned like torch's): when a
// tensor frees one it is kept, and the next request of about the same size (up to 1/8 larger) takes it
// instead of asking the system for fresh pages. Kept blocks must fit two bounds, past which the largest are
// freed: at most `max_cached` bytes, and the cache's blocks in use plus those kept at most `slack` bytes above
// the most in use at any moment since the last empty. The second bound is why the cache does not raise a
// phase's peak memory: what it keeps fills the room that the phase's own high-water mark left, and a phase
// that reaches a new high-water mark gives its kept blocks back first. `thinkrl_cache_empty` frees every
// kept block (between phases). Smaller blocks come from torch's own allocator, as before. Every block, small or large, carries this file's deleter, which
// tells them apart by whether the cache made them; that deleter is also the raw one oneDNN frees through.
//
// The cache changes where memory comes from, never what a tensor holds: torch never promised zeroed memory
// from torch.empty, and nothing in thinkrl reads memory it did not write.

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <cstdlib>
#include <iterator>
#include <map>
#include <mutex>
#include <unordered_map>

namespace {

constexpr size_t kGranule = size_t(1) << 16;  // sizes round up to 64 KiB, so near sizes share blocks

struct BlockCache final : c10::Allocator {
  c10::Allocator* base = nullptr;        // torch's allocator: small blocks, and the last resort
  c10::DeleterFnPtr base_free = nullptr; // its raw deleter
  size_t min_bytes = 0, max_cached = 0, slack = 0, cached = 0, hits = 0, misses = 0;
  size_t live = 0, live_peak = 0;  // bytes of the cache's blocks in use now, and their most since the last empty
  size_t held_peak = 0;            // the most in use plus kept since the last empty (stats; the bound's check)
  std::mutex mu;
  std::multimap<size_t, void*> kept;        // freed blocks by size
  std::unordered_map<void*, size_t> owned;  // every block the cache made, live or kept

  static void release(void* p);

  c10::DataPtr wrap(void* p) { return {p, p, &release, c10::Device(c10::DeviceType::CPU)}; }

  c10::DataPtr allocate(size_t n) override {
    if (n < min_bytes) return wrap(base->allocate(n).release_context());  // torch's block (its context is its data)
    size_t size = (n + kGranule - 1) / kGranule * kGranule;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = kept.lower_bound(size);
      if (it != kept.end() && it->first <= size + size / 8) {
        void* p = it->second;
        size_t got = it->first;
        cached -= got;
        kept.erase(it);
        hits++;
        in_use(got);  // a kept block goes into use: the total held is unchanged
        trim();
        return wrap(p);
      }
      misses++;
      in_use(size);  // counted before it is made, so that trim() makes room for it first
      trim();
    }
    void* p = nullptr;
    if (posix_memalign(&p, 64, size) != 0) {
      empty();  // give back what is kept, then try once more; torch's allocator reports a real shortage
      if (posix_memalign(&p, 64, size) != 0) {
        std::lock_guard<std::mutex> lock(mu);
        live -= size;  // torch's block instead: not the cache's
        return wrap(base->allocate(n).release_context());
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    owned[p] = size;
    return wrap(p);
  }

  void put(void* p) {
    std::unique_lock<std::mutex> lock(mu);
    auto found = owned.find(p);
    if (found == owned.end()) {  // torch's block
      lock.unlock();
      base_free(p);
      return;
    }
    live -= found->second;
    kept.emplace(found->second, p);
    cached += found->second;
    trim();
  }

  // (under mu) a block of `size` bytes went into use
  void in_use(size_t size) {
    live += size;
    if (live > live_peak) live_peak = live;
  }

  // (under mu) free the largest kept blocks until what is kept fits both bounds
  void trim() {
    while (!kept.empty() && (cached > max_cached || live + cached > live_peak + slack)) {
      auto largest = std::prev(kept.end());
      cached -= largest->first;
      owned.erase(largest->second);
      std::free(largest->second);
      kept.erase(largest);
    }
    if (live + cached > held_peak) held_peak = live + cached;
  }

  void empty() {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& [size, p] : kept) {
      owned.erase(p);
      std::free(p);
    }
    kept.clear();
    cached = 0;
    live_peak = held_peak = live;  // a new phase: its own high-water mark
  }

  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
};

BlockCache* cache = nullptr;  // made once, never destroyed: tensors may be freed during interpreter exit

void BlockCache::release(void* p) { cache->put(p); }

}  // namespace

// 0: installed; 1: already installed; 2: torch's allocator has no raw deleter (then nothing is changed).
extern "C" int thinkrl_cache_install(size_t min_bytes, size_t max_cached, size_t slack) {
  if (cache != nullptr) return 1;
  c10::Allocator* base = c10::GetCPUAllocator();
  if (base->raw_deleter() == nullptr) return 2;
  cache = new BlockCache();
  cache->base = base;
  cache->base_free = base->raw_deleter();
  cache->min_bytes = min_bytes;
  cache->max_cached = max_cached;
  cache->slack = slack;
  c10::SetCPUAllocator(cache, /*priority=*/100);
  return 0;
}

extern "C" void thinkrl_cache_empty() {
  if (cache != nullptr) cache->empty();
}

// out: bytes kept, hits, misses, blocks the cache made (in use or kept), and since the last empty the most bytes
// of its blocks in use and the most in use plus kept.
extern "C" void thinkrl_cache_stats(size_t* out) {
  if (cache == nullptr) return;
  std::lock_guard<std::mutex> lock(cache->mu);
  out[0] = cache->cached;
  out[1] = cache->hits;
  out[2] = cache->misses;
  out[3] = cache->owned.size();
  out[4] = cache->live_peak;
  out[5] = cache->held_peak;
}
