#include "kv/prefix_cache.h"

#include <algorithm>
#include <functional>

#include "core/error.h"

namespace moeserve {

struct PrefixCache::Node {
  std::vector<int32_t> key;  // page_size tokens
  int32_t page = -1;
  Node* parent = nullptr;
  std::map<std::vector<int32_t>, std::unique_ptr<Node>> children;
  int64_t lock_count = 0;
  uint64_t last_used = 0;
};

PrefixCache::PrefixCache(PageAllocator& alloc, int64_t page_size, bool enabled)
    : alloc_(alloc), page_size_(page_size), enabled_(enabled), root_(std::make_unique<Node>()) {}

PrefixCache::~PrefixCache() = default;

PrefixCache::Node* PrefixCache::child(Node* n, const int32_t* page_tokens) const {
  auto it = n->children.find(std::vector<int32_t>(page_tokens, page_tokens + page_size_));
  return it == n->children.end() ? nullptr : it->second.get();
}

PrefixCache::Match PrefixCache::match(const int32_t* tokens, int64_t max_tokens) {
  Match m;
  if (!enabled_) return m;
  Node* n = root_.get();
  ++clock_;
  for (int64_t p = 0; (p + 1) * page_size_ <= max_tokens; ++p) {
    Node* c = child(n, tokens + p * page_size_);
    if (!c) break;
    c->last_used = clock_;
    m.nodes.push_back(c);
    m.pages.push_back(c->page);
    n = c;
  }
  return m;
}

void PrefixCache::lock(const Match& m) {
  for (Node* n : m.nodes) ++n->lock_count;
}

void PrefixCache::unlock(const std::vector<Node*>& nodes) {
  for (Node* n : nodes) {
    MS_CHECK(n->lock_count > 0, "unlock of an unlocked prefix node");
    --n->lock_count;
  }
}

void PrefixCache::release(const int32_t* tokens, int64_t n_tokens, const std::vector<int32_t>& pages,
                          const Match& prefix) {
  const size_t shared = prefix.nodes.size();
  MS_CHECK(pages.size() >= shared, "release: {} pages for a prefix of {}", pages.size(), shared);
  std::vector<int32_t> to_free;
  if (!enabled_) {
    to_free.assign(pages.begin() + shared, pages.end());
    alloc_.free(to_free);
    unlock(prefix.nodes);
    return;
  }
  Node* n = shared ? prefix.nodes.back() : root_.get();
  ++clock_;
  const int64_t full_pages = n_tokens / page_size_;
  size_t p = shared;
  for (; int64_t(p) < full_pages && p < pages.size(); ++p) {
    const int32_t* key = tokens + p * page_size_;
    Node* c = child(n, key);
    if (c) {
      to_free.push_back(pages[p]);  // another request cached the same tokens first: keep theirs
    } else {
      c = add_child(n, key, pages[p]);
    }
    c->last_used = clock_;
    n = c;
  }
  for (; p < pages.size(); ++p) to_free.push_back(pages[p]);
  alloc_.free(to_free);
  unlock(prefix.nodes);
}

void PrefixCache::insert_running(const int32_t* tokens, int64_t n_tokens, const std::vector<int32_t>& pages,
                                 Match& prefix) {
  if (!enabled_) return;
  Node* n = prefix.nodes.empty() ? root_.get() : prefix.nodes.back();
  const int64_t full_pages = std::min<int64_t>(n_tokens / page_size_, int64_t(pages.size()));
  ++clock_;
  for (size_t p = prefix.nodes.size(); int64_t(p) < full_pages; ++p) {
    const int32_t* key = tokens + p * page_size_;
    if (child(n, key)) break;  // cached by another request first: the rest stays this request's
    Node* c = add_child(n, key, pages[p]);
    c->lock_count = 1;  // held by the request, as a matched prefix is
    prefix.nodes.push_back(c);
    prefix.pages.push_back(pages[p]);
    n = c;
  }
}

PrefixCache::Node* PrefixCache::add_child(Node* n, const int32_t* key, int32_t page) {
  auto node = std::make_unique<Node>();
  node->key.assign(key, key + page_size_);
  node->page = page;
  node->parent = n;
  node->last_used = clock_;
  Node* c = node.get();
  n->children.emplace(node->key, std::move(node));
  ++num_nodes_;
  return c;
}

void PrefixCache::remove_leaf(Node* n) {
  MS_CHECK(n->children.empty() && n->lock_count == 0 && n->parent, "remove_leaf of a node in use");
  alloc_.free({n->page});
  Node* parent = n->parent;
  std::vector<int32_t> key = n->key;  // a copy: erasing destroys n and its key
  parent->children.erase(key);
  --num_nodes_;
}

int64_t PrefixCache::evict(int64_t want) {
  int64_t freed = 0;
  while (freed < want) {
    // Collect evictable leaves; evict the least recently used. O(nodes) per round, rounds batch many pages.
    std::vector<Node*> leaves;
    std::function<void(Node*)> walk = [&](Node* n) {
      for (auto& [k, c] : n->children) {
        if (c->children.empty()) {
          if (c->lock_count == 0) leaves.push_back(c.get());
        } else {
          walk(c.get());
        }
      }
    };
    walk(root_.get());
    if (leaves.empty()) break;
    std::sort(leaves.begin(), leaves.end(), [](Node* a, Node* b) { return a->last_used < b->last_used; });
    for (Node* l : leaves) {
      if (freed >= want) break;
      remove_leaf(l);
      ++freed;
    }
  }
  return freed;
}

int64_t PrefixCache::evictable_pages() const {
  // A node is evictable eventually iff no node in its subtree is locked.
  std::function<std::pair<int64_t, bool>(const Node*)> count = [&](const Node* n) -> std::pair<int64_t, bool> {
    int64_t total = 0;
    bool any_locked = n->lock_count > 0;
    for (auto& [k, c] : n->children) {
      auto [t, locked] = count(c.get());
      total += t;
      any_locked |= locked;
    }
    if (n != root_.get() && !any_locked) ++total;
    return {total, any_locked};
  };
  return count(root_.get()).first;
}

int64_t PrefixCache::flush() { return evict(num_nodes_); }

void PrefixCache::check_integrity(int64_t pages_held_by_requests) const {
  int64_t nodes = 0;
  std::vector<uint8_t> seen(alloc_.num_pages(), 0);
  std::function<void(const Node*)> walk = [&](const Node* n) {
    for (auto& [k, c] : n->children) {
      MS_CHECK(c->parent == n, "broken parent link");
      MS_CHECK(int64_t(c->key.size()) == page_size_, "node key of {} tokens", c->key.size());
      MS_CHECK(c->lock_count >= 0, "negative lock count");
      MS_CHECK(c->page >= 0 && c->page < alloc_.num_pages() && !seen[c->page], "page {} owned twice", c->page);
      seen[c->page] = 1;
      ++nodes;
      walk(c.get());
    }
  };
  walk(root_.get());
  MS_CHECK(nodes == num_nodes_, "node count {} != {}", nodes, num_nodes_);
  MS_CHECK(alloc_.num_free() + nodes + pages_held_by_requests == alloc_.num_pages(),
           "pages leaked: {} free + {} cached + {} in requests != {}", alloc_.num_free(), nodes,
           pages_held_by_requests, alloc_.num_pages());
}

}  // namespace moeserve
