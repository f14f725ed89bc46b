// Radix prefix cache at page granularity: a tree whose nodes each hold one full KV page (page_size tokens)
// keyed by those tokens. A request that starts with a cached prefix reuses its pages instead of recomputing.
//
// Contract (checked by check_integrity() in tests):
//  - every page is owned by exactly one of: the free list, one tree node, or one running request;
//  - a node with lock_count > 0 is in use by a running request and is never evicted;
//  - only leaves with lock_count == 0 are evictable, least recently used first.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "kv/kv_pool.h"

namespace moeserve {

class PrefixCache {
 public:
  struct Node;
  struct Match {
    std::vector<Node*> nodes;     // locked by lock(), one per matched page
    std::vector<int32_t> pages;   // their KV pages, in position order
    int64_t tokens() const { return int64_t(pages.size()); }  // pages, multiply by page_size for tokens
  };

  PrefixCache(PageAllocator& alloc, int64_t page_size, bool enabled);
  ~PrefixCache();
  bool enabled() const { return enabled_; }
  int64_t page_size() const { return page_size_; }

  // Longest cached prefix of tokens[0, max_tokens), in whole pages. Not locked yet.
  Match match(const int32_t* tokens, int64_t max_tokens);
  void lock(const Match& m);
  void unlock(const std::vector<Node*>& nodes);

  // A finished (or preempted) request gives back its KV: tokens[0, n_tokens) are computed in `pages`
  // (pages[i] holds tokens [i*page_size, (i+1)*page_size)). `prefix` is the match it was admitted with (its
  // first prefix.nodes.size() pages are the tree's). Full pages not yet in the tree become nodes; duplicates
  // and the partial tail go back to the allocator. Unlocks the prefix.
  void release(const int32_t* tokens, int64_t n_tokens, const std::vector<int32_t>& pages, const Match& prefix);

  // A running request shares what it has computed so far (SGLang's cache of unfinished requests): the full pages of
  // tokens[0, n_tokens) past its prefix become nodes holding its own pages, locked by it and appended to `prefix`, so
  // that requests admitted from now on match them while it runs. Stops at the first page another request cached
  // first (those pages stay the request's own, freed as duplicates by release). pages[i] holds tokens
  // [i*page_size, (i+1)*page_size), and every page given must be computed.
  void insert_running(const int32_t* tokens, int64_t n_tokens, const std::vector<int32_t>& pages, Match& prefix);

  // Frees up to n evictable pages (LRU leaves first); returns how many were freed.
  int64_t evict(int64_t n);
  int64_t evictable_pages() const;
  int64_t cached_pages() const { return num_nodes_; }
  // Drops every unlocked node (POST /flush_cache). Returns pages freed.
  int64_t flush();
  // Throws InternalError if the contract above is broken (tests only).
  void check_integrity(int64_t pages_held_by_requests) const;

 private:
  Node* child(Node* n, const int32_t* page_tokens) const;
  // A new child of n for the page of tokens at key, holding `page`, unlocked and used now.
  Node* add_child(Node* n, const int32_t* key, int32_t page);
  void remove_leaf(Node* n);

  PageAllocator& alloc_;
  int64_t page_size_;
  bool enabled_;
  std::unique_ptr<Node> root_;
  int64_t num_nodes_ = 0;
  uint64_t clock_ = 0;
};

}  // namespace moeserve
