#include "torch_file.h"

#include <algorithm>
#include <deque>
#include <map>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dcp/error.h"
#include "zip_archive.h"

namespace dcp::torch_file {
namespace {

// The callables and classes a state dict's pickle names, by "module.name".
enum class Global { ordered_dict, rebuild_tensor, rebuild_tensor_v2, rebuild_parameter, storage };

// torch's typed storage classes and the dtype (safetensors' name) of their elements.
const std::map<std::string, std::string>& storage_dtypes() {
  static const std::map<std::string, std::string> m{{"torch.FloatStorage", "F32"},
                                                    {"torch.HalfStorage", "F16"},
                                                    {"torch.BFloat16Storage", "BF16"},
                                                    {"torch.DoubleStorage", "F64"},
                                                    {"torch.LongStorage", "I64"},
                                                    {"torch.IntStorage", "I32"},
                                                    {"torch.ShortStorage", "I16"},
                                                    {"torch.CharStorage", "I8"},
                                                    {"torch.ByteStorage", "U8"},
                                                    {"torch.BoolStorage", "BOOL"},
                                                    {"torch.Float8_e4m3fnStorage", "F8_E4M3"},
                                                    {"torch.Float8_e5m2Storage", "F8_E5M2"}};
  return m;
}

struct Object {
  enum class Kind {
    none,
    boolean,
    integer,
    real,
    text,
    bytes,
    tuple,
    list,
    dict,
    global,
    storage,
    tensor
  };
  Kind kind = Kind::none;
  std::int64_t integer = 0;                 // integer, boolean; storage: its element count
  std::string text;                         // text, bytes; global: "module.name"; storage: its key
  std::vector<Object*> items;               // tuple, list; dict: key, value, key, value, ...
  Global global{};                          // global
  std::string dtype;                        // storage, tensor
  const Object* storage = nullptr;          // tensor
  std::int64_t offset = 0;                  // tensor: in elements of its storage
  std::vector<std::int64_t> shape, stride;  // tensor
};

const char* kind_name(Object::Kind k) {
  switch (k) {
    case Object::Kind::none: return "None";
    case Object::Kind::boolean: return "a bool";
    case Object::Kind::integer: return "an int";
    case Object::Kind::real: return "a float";
    case Object::Kind::text: return "a str";
    case Object::Kind::bytes: return "bytes";
    case Object::Kind::tuple: return "a tuple";
    case Object::Kind::list: return "a list";
    case Object::Kind::dict: return "a dict";
    case Object::Kind::global: return "a class or function";
    case Object::Kind::storage: return "a storage";
    case Object::Kind::tensor: return "a tensor";
  }
  return "an object";
}

// A pickle machine for protocols 2-5 that builds only the objects above. Objects live in an
// arena, so a pickle that makes a cycle (a list holding itself) frees like any other.
class Unpickler {
 public:
  Unpickler(const std::uint8_t* data, std::size_t size, std::string where)
      : p_(data), size_(size), where_(std::move(where)) {}

  const Object& run() {
    while (true) {
      need(1);
      const std::uint8_t op = p_[pos_++];
      switch (op) {
        case 0x80: {  // PROTO
          const int version = static_cast<int>(take(1));
          check(version >= 2 && version <= 5, "pickle protocol ", version,
                " (torch.save writes 2; dcp reads 2 to 5)");
          break;
        }
        case 0x95: take(8); break;  // FRAME: a length hint only
        case '.':                   // STOP
          check(stack_.size() == 1 && marks_.empty(), "the pickle ends with ", stack_.size(),
                " objects on its stack instead of one");
          return *stack_.back();
        case '(': marks_.push_back(stack_.size()); break;  // MARK
        case ')': push(make(Object::Kind::tuple)); break;  // EMPTY_TUPLE
        case 't': {                                        // TUPLE
          Object* t = make(Object::Kind::tuple);
          t->items = pop_mark();
          push(t);
          break;
        }
        case 0x85:
        case 0x86:
        case 0x87: {  // TUPLE1-3
          const std::size_t n = static_cast<std::size_t>(op - 0x84);
          check(stack_.size() >= n + floor(), "TUPLE", n, " on a stack of fewer objects");
          Object* t = make(Object::Kind::tuple);
          t->items.assign(stack_.end() - static_cast<std::ptrdiff_t>(n), stack_.end());
          stack_.resize(stack_.size() - n);
          push(t);
          break;
        }
        case ']': push(make(Object::Kind::list)); break;  // EMPTY_LIST
        case 'l': {                                       // LIST
          Object* l = make(Object::Kind::list);
          l->items = pop_mark();
          push(l);
          break;
        }
        case 'a': {  // APPEND
          Object* v = pop();
          container(Object::Kind::list, "APPEND")->items.push_back(v);
          break;
        }
        case 'e': {  // APPENDS
          std::vector<Object*> vs = pop_mark();
          Object* l = container(Object::Kind::list, "APPENDS");
          l->items.insert(l->items.end(), vs.begin(), vs.end());
          break;
        }
        case '}': push(make(Object::Kind::dict)); break;  // EMPTY_DICT
        case 'd': {                                       // DICT
          std::vector<Object*> kv = pop_mark();
          check(kv.size() % 2 == 0, "DICT of an odd number of objects");
          Object* d = make(Object::Kind::dict);
          d->items = std::move(kv);
          push(d);
          break;
        }
        case 's': {  // SETITEM
          Object* v = pop();
          Object* k = pop();
          Object* d = container(Object::Kind::dict, "SETITEM");
          d->items.push_back(k);
          d->items.push_back(v);
          break;
        }
        case 'u': {  // SETITEMS
          std::vector<Object*> kv = pop_mark();
          check(kv.size() % 2 == 0, "SETITEMS of an odd number of objects");
          Object* d = container(Object::Kind::dict, "SETITEMS");
          d->items.insert(d->items.end(), kv.begin(), kv.end());
          break;
        }
        case 'N': push(make(Object::Kind::none)); break;
        case 0x88:
        case 0x89: {  // NEWTRUE, NEWFALSE
          Object* b = make(Object::Kind::boolean);
          b->integer = op == 0x88;
          push(b);
          break;
        }
        case 'J': push_int(static_cast<std::int32_t>(take(4))); break;  // BININT
        case 'K': push_int(static_cast<std::int64_t>(take(1))); break;  // BININT1
        case 'M': push_int(static_cast<std::int64_t>(take(2))); break;  // BININT2
        case 0x8a: {  // LONG1: n bytes, little-endian two's complement
          const std::size_t n = take(1);
          check(n <= 8, "an integer of ", n, " bytes (dcp reads up to 64 bits)");
          std::uint64_t v = take(n);
          if (n > 0 && n < 8 && (v >> (8 * n - 1)) != 0) v |= ~std::uint64_t{0} << (8 * n);
          push_int(static_cast<std::int64_t>(v));
          break;
        }
        case 'G':  // BINFLOAT: floats only pass through (a tensor's metadata), unread
          take(8);
          push(make(Object::Kind::real));
          break;
        case 'X': push_text(Object::Kind::text, take(4)); break;    // BINUNICODE
        case 0x8c: push_text(Object::Kind::text, take(1)); break;   // SHORT_BINUNICODE
        case 0x8d: push_text(Object::Kind::text, take(8)); break;   // BINUNICODE8
        case 'C': push_text(Object::Kind::bytes, take(1)); break;   // SHORT_BINBYTES
        case 'B': push_text(Object::Kind::bytes, take(4)); break;   // BINBYTES
        case 0x8e: push_text(Object::Kind::bytes, take(8)); break;  // BINBYTES8
        case 'c': {                                                 // GLOBAL: "module\nname\n"
          const std::string module = line(), name = line();
          push(global(module + "." + name));
          break;
        }
        case 0x93: {  // STACK_GLOBAL
          Object* name = pop();
          Object* module = pop();
          check(module->kind == Object::Kind::text && name->kind == Object::Kind::text,
                "STACK_GLOBAL of ", kind_name(module->kind), " and ", kind_name(name->kind));
          push(global(module->text + "." + name->text));
          break;
        }
        case 'R': {  // REDUCE
          Object* args = pop();
          Object* f = pop();
          check(f->kind == Object::Kind::global && args->kind == Object::Kind::tuple, "REDUCE of ",
                kind_name(f->kind), " with ", kind_name(args->kind));
          push(call(*f, args->items));
          break;
        }
        case 'b': {  // BUILD: an object's state. OrderedDict's (a state dict's _metadata) is not
                     // needed to read its tensors.
          pop();
          check(!stack_.empty() && stack_.back()->kind == Object::Kind::dict, "BUILD on ",
                stack_.empty() ? "nothing" : kind_name(stack_.back()->kind),
                " (dcp sets state only on a dict)");
          break;
        }
        case 'Q': push(storage(*pop())); break;         // BINPERSID
        case 'q': memo_[take(1)] = top(); break;        // BINPUT
        case 'r': memo_[take(4)] = top(); break;        // LONG_BINPUT
        case 0x94: memo_[memo_.size()] = top(); break;  // MEMOIZE
        case 'h': push(recall(take(1))); break;         // BINGET
        case 'j': push(recall(take(4))); break;         // LONG_BINGET
        case '0': pop(); break;                         // POP
        case '1': pop_mark(); break;                    // POP_MARK
        default:
          fail("opcode 0x", hex(op), " at byte ", pos_ - 1,
               ", which a state dict of tensors does not use (dcp reads the opcodes torch.save "
               "writes)");
      }
    }
  }

  // Storage key -> (dtype, element count), every one the pickle referred to.
  const std::map<std::string, std::pair<std::string, std::int64_t>>& storages() const {
    return storages_;
  }

 private:
  template <typename... Args>
  [[noreturn]] void fail(const Args&... args) const {
    throw Error(ErrorCategory::io, str(where_, ": ", args...));
  }
  template <typename... Args>
  void check(bool ok, const Args&... args) const {
    if (!ok) fail(args...);
  }
  static std::string hex(unsigned v) {
    const char* digits = "0123456789abcdef";
    return {digits[(v >> 4) & 15u], digits[v & 15u]};
  }

  void need(std::size_t n) const {
    check(n <= size_ - pos_, "the pickle ends inside an opcode (", size_, " bytes)");
  }
  // An n-byte little-endian unsigned field (n <= 8).
  std::uint64_t take(std::size_t n) {
    need(n);
    std::uint64_t v = 0;
    for (std::size_t i = n; i-- > 0;) v = (v << 8) | p_[pos_ + i];
    pos_ += n;
    return v;
  }
  std::string line() {
    const std::size_t start = pos_;
    while (pos_ < size_ && p_[pos_] != '\n') ++pos_;
    check(pos_ < size_, "the pickle ends inside a GLOBAL name");
    return std::string(reinterpret_cast<const char*>(p_ + start), pos_++ - start);
  }

  Object* make(Object::Kind kind) {
    arena_.emplace_back();
    arena_.back().kind = kind;
    return &arena_.back();
  }
  std::size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  void push(Object* o) { stack_.push_back(o); }
  Object* top() const {
    check(!stack_.empty(), "a memo store with nothing on the stack");
    return stack_.back();
  }
  Object* pop() {
    check(stack_.size() > floor(), "an opcode takes an object from an empty stack");
    Object* o = stack_.back();
    stack_.pop_back();
    return o;
  }
  std::vector<Object*> pop_mark() {
    check(!marks_.empty(), "an opcode needs a MARK that is not there");
    const std::size_t m = marks_.back();
    marks_.pop_back();
    std::vector<Object*> items(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
    stack_.resize(m);
    return items;
  }
  Object* container(Object::Kind kind, const char* op) const {
    check(stack_.size() > floor() && stack_.back()->kind == kind, op, " on ",
          stack_.size() > floor() ? kind_name(stack_.back()->kind) : "nothing");
    return stack_.back();
  }
  Object* recall(std::uint64_t key) const {
    const auto it = memo_.find(key);
    check(it != memo_.end(), "the pickle recalls memo entry ", key, ", never stored");
    return it->second;
  }
  void push_int(std::int64_t v) {
    Object* o = make(Object::Kind::integer);
    o->integer = v;
    push(o);
  }
  void push_text(Object::Kind kind, std::uint64_t length) {
    need(length);  // bounded by the pickle, so never a huge allocation
    Object* o = make(kind);
    o->text.assign(reinterpret_cast<const char*>(p_ + pos_), static_cast<std::size_t>(length));
    pos_ += static_cast<std::size_t>(length);
    push(o);
  }

  Object* global(const std::string& name) {
    static const std::map<std::string, Global> callables{
        {"collections.OrderedDict", Global::ordered_dict},
        {"torch._utils._rebuild_tensor", Global::rebuild_tensor},
        {"torch._utils._rebuild_tensor_v2", Global::rebuild_tensor_v2},
        {"torch._utils._rebuild_parameter", Global::rebuild_parameter},
        {"torch._utils._rebuild_parameter_with_state", Global::rebuild_parameter}};
    Object* g = make(Object::Kind::global);
    g->text = name;
    if (const auto it = callables.find(name); it != callables.end()) {
      g->global = it->second;
    } else if (const auto s = storage_dtypes().find(name); s != storage_dtypes().end()) {
      g->global = Global::storage;
      g->dtype = s->second;
    } else {
      fail("the pickle names '", name,
           "', which a state dict of tensors does not need; dcp loads only "
           "collections.OrderedDict, torch._utils' tensor and parameter rebuilders and torch's "
           "storage types, and runs nothing (convert other pickles with torch, then "
           "safetensors.torch.save_file)");
    }
    return g;
  }

  // ('storage', storage type, key, location, element count): a storage saved in data/<key>.
  Object* storage(const Object& pid) {
    const auto& it = pid.items;
    check(pid.kind == Object::Kind::tuple && it.size() == 5 && it[0]->kind == Object::Kind::text &&
              it[0]->text == "storage" && it[1]->kind == Object::Kind::global &&
              it[1]->global == Global::storage && it[2]->kind == Object::Kind::text &&
              it[3]->kind == Object::Kind::text && it[4]->kind == Object::Kind::integer &&
              it[4]->integer >= 0,
          "a persistent id that is not ('storage', torch storage type, key, location, size)");
    Object* s = make(Object::Kind::storage);
    s->dtype = it[1]->dtype;
    s->text = it[2]->text;
    s->integer = it[4]->integer;
    const auto [at, fresh] = storages_.emplace(s->text, std::make_pair(s->dtype, s->integer));
    check(fresh || at->second == std::make_pair(s->dtype, s->integer), "storage '", s->text,
          "' is named twice with different types or sizes");
    return s;
  }

  std::vector<std::int64_t> ints(const Object& o, const char* what) const {
    check(o.kind == Object::Kind::tuple, "a tensor's ", what, " is ", kind_name(o.kind),
          ", not a tuple");
    std::vector<std::int64_t> v;
    for (const Object* i : o.items) {
      check(i->kind == Object::Kind::integer, "a tensor's ", what, " holds ", kind_name(i->kind));
      v.push_back(i->integer);
    }
    return v;
  }

  Object* call(const Object& f, const std::vector<Object*>& args) {
    switch (f.global) {
      case Global::ordered_dict:
        check(args.empty(), "collections.OrderedDict called with arguments");
        return make(Object::Kind::dict);
      case Global::rebuild_tensor:
      case Global::rebuild_tensor_v2: {
        // (storage, storage_offset, size, stride[, requires_grad, backward_hooks[, metadata]])
        const bool v2 = f.global == Global::rebuild_tensor_v2;
        check(v2 ? args.size() == 6 || args.size() == 7 : args.size() == 4, f.text, " called with ",
              args.size(), " arguments");
        check(args[0]->kind == Object::Kind::storage && args[1]->kind == Object::Kind::integer,
              f.text, " called without a storage and an offset");
        Object* t = make(Object::Kind::tensor);
        t->storage = args[0];
        t->dtype = args[0]->dtype;
        t->offset = args[1]->integer;
        t->shape = ints(*args[2], "size");
        t->stride = ints(*args[3], "stride");
        check(t->shape.size() == t->stride.size(), "a tensor of ", t->shape.size(),
              " dimensions with ", t->stride.size(), " strides");
        return t;
      }
      case Global::rebuild_parameter:  // (data, requires_grad, backward_hooks[, state])
        check(!args.empty() && args[0]->kind == Object::Kind::tensor, f.text,
              " called without a tensor");
        return args[0];
      case Global::storage: break;
    }
    fail(f.text, " is called, which a saved tensor does not do");
  }

  const std::uint8_t* p_;
  std::size_t size_;
  std::size_t pos_ = 0;
  std::string where_;
  std::deque<Object> arena_;
  std::vector<Object*> stack_;
  std::vector<std::size_t> marks_;
  std::unordered_map<std::uint64_t, Object*> memo_;
  std::map<std::string, std::pair<std::string, std::int64_t>> storages_;
};

std::string list(const std::vector<std::int64_t>& v) {
  std::string out = "(";
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + (v.size() == 1 ? ",)" : ")");
}

}  // namespace

File::File(const std::string& path) : TensorFile(path, "torch checkpoint") {
  const std::uint8_t* file = map();
  if (!zip::looks_like_zip(file, size())) {
    // torch before 1.6 wrote a bare pickle stream (its magic number first), older ones a tar.
    throw Error(ErrorCategory::io,
                str(path,
                    ": not a zip archive; if it is torch's legacy (pre-1.6) format, load it "
                    "with torch and save it as safetensors (safetensors.torch.save_file)"));
  }
  const std::vector<zip::Entry> entries = zip::read_directory(file, size(), path);
  std::map<std::string, const zip::Entry*> by_name;
  const zip::Entry* pickle = nullptr;
  for (const zip::Entry& e : entries) {
    by_name[e.name] = &e;
    const std::size_t slash = e.name.rfind('/');
    if (slash != std::string::npos && e.name.compare(slash, std::string::npos, "/data.pkl") == 0) {
      DCP_CHECK(pickle == nullptr, io, path, ": two pickles in one archive ('", pickle->name,
                "' and '", e.name, "')");
      pickle = &e;
    }
  }
  DCP_CHECK(pickle != nullptr, io, path,
            ": a zip archive without '<name>/data.pkl', so not one torch.save wrote");
  const std::string prefix = pickle->name.substr(0, pickle->name.size() - 8);  // "<name>/"
  const auto stored = [&](const zip::Entry& e) {
    DCP_CHECK(e.method == 0, io, path, ": entry '", e.name, "' is compressed (method ", e.method,
              "); torch.save stores its entries uncompressed, so save the state dict again");
  };
  stored(*pickle);
  DCP_CHECK(zip::crc32(file + pickle->offset, pickle->size) == pickle->crc32, io, path, ": entry '",
            pickle->name, "' fails its CRC-32 (a corrupted file)");
  if (const auto b = by_name.find(prefix + "byteorder"); b != by_name.end()) {
    stored(*b->second);
    const std::string order(reinterpret_cast<const char*>(file + b->second->offset),
                            static_cast<std::size_t>(b->second->size));
    DCP_CHECK(order == "little", io, path, ": saved with byte order '", order,
              "'; dcp reads little-endian checkpoints");
  }

  Unpickler unpickler(file + pickle->offset, static_cast<std::size_t>(pickle->size),
                      path + " (" + pickle->name + ")");
  const Object& root = unpickler.run();
  DCP_CHECK(root.kind == Object::Kind::dict, io, path, ": the pickle holds ", kind_name(root.kind),
            ", not a state dict (a dict of name -> tensor)");

  // Each storage: a stored entry of exactly its element count x element size.
  std::map<std::string, const zip::Entry*> storage_entry;
  for (const auto& [key, info] : unpickler.storages()) {
    const auto& [dtype, count] = info;
    const auto e = by_name.find(prefix + "data/" + key);
    DCP_CHECK(e != by_name.end(), io, path, ": storage '", key, "' has no entry '", prefix, "data/",
              key, "'");
    stored(*e->second);
    const std::uint64_t eb = dtype_bytes(dtype);
    DCP_CHECK(static_cast<std::uint64_t>(count) <= e->second->size / eb &&
                  static_cast<std::uint64_t>(count) * eb == e->second->size,
              io, path, ": storage '", key, "' holds ", count, " ", dtype,
              " values, but its entry '", e->second->name, "' has ", e->second->size, " bytes");
    storage_entry[key] = e->second;
  }

  for (std::size_t i = 0; i < root.items.size(); i += 2) {
    const Object& key = *root.items[i];
    const Object& value = *root.items[i + 1];
    DCP_CHECK(key.kind == Object::Kind::text, io, path, ": a state dict key is ",
              kind_name(key.kind), ", not a str");
    const std::string& name = key.text;
    DCP_CHECK(value.kind == Object::Kind::tensor, io, path, ": '", name, "' is ",
              kind_name(value.kind), ", not a tensor (dcp reads a flat state dict of tensors)");
    const std::int64_t available = value.storage->integer;
    // Row-major and inside the storage; a dimension of one element may have any stride.
    const bool empty =
        std::find(value.shape.begin(), value.shape.end(), std::int64_t{0}) != value.shape.end();
    std::int64_t count = empty ? 0 : 1;
    bool contiguous = true;
    for (std::size_t d = value.shape.size(); d-- > 0;) {
      const std::int64_t n = value.shape[d];
      DCP_CHECK(n >= 0, io, path, ": tensor '", name, "' has a negative dimension");
      if (empty) continue;
      DCP_CHECK(count <= available / n, io, path, ": tensor '", name,
                "' is larger than its storage '", value.storage->text, "' of ", available,
                " values");
      if (n != 1 && value.stride[d] != count) contiguous = false;
      count *= n;
    }
    DCP_CHECK(contiguous, io, path, ": tensor '", name, "' is a non-contiguous view (shape ",
              list(value.shape), ", stride ", list(value.stride),
              "); dcp reads row-major tensors: save tensor.contiguous()");
    DCP_CHECK(value.offset >= 0 && value.offset <= available && count <= available - value.offset,
              io, path, ": tensor '", name, "' (", count, " values from offset ", value.offset,
              ") runs past its storage '", value.storage->text, "' of ", available, " values");
    const std::uint64_t eb = dtype_bytes(value.dtype);
    TensorInfo t;
    t.dtype = value.dtype;
    t.shape = value.shape;
    t.begin = storage_entry.at(value.storage->text)->offset +
              static_cast<std::uint64_t>(value.offset) * eb;
    t.end = t.begin + static_cast<std::uint64_t>(count) * eb;
    tensors_[name] = std::move(t);  // a repeated key replaces the earlier one, as in Python
  }
}

}  // namespace dcp::torch_file
