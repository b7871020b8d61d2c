//===- ernie-fuzz-mlir.cpp - mutation fuzzing of parser, verifier, passes -===//
//
// Feeds mutated ernie IR through the MLIR parser, the verifier, the ernie
// pass pipelines (--ernie-auto-parallel-pipeline; pipeline split, autodiff
// and schedule) and the program writer, in process, and checks only that
// each input ends in success or a diagnostic: no crash, no hang.
//
// Inputs are the seeds (every `.mlir` under the given paths, cut at
// `// -----` and `//---`) mutated at the token level: numbers swapped for
// 0, -1, 2^32, huge values; tokens, operands and lines deleted, duplicated
// or swapped; op names, element types, SSA names, strings and attribute
// values replaced. Input `i` of seed `s` is a function of (s, i) alone, so a
// crash is reproduced by its number.
//
// Inputs run in batches in a forked child (a fresh MLIRContext each, with
// diagnostics swallowed) under a per-input alarm and a memory limit. When a
// child dies, the parent rebuilds the input it was running, writes it to the
// crash directory with the pipeline that killed it, and goes on after it.
//
//   ernie-fuzz-mlir [--iterations N] [--seed S] [--crash-dir D]
//                   [--time-limit SECONDS] [--max-seconds T]
//                   [--first I] [--print-input I] [--list-pipelines]
//                   [--verbose] PATH...
//
// ERNIE_FUZZ_ITERATIONS, when set, overrides --iterations (and lifts
// --max-seconds): the suite's short run becomes a long one.
//
//===----------------------------------------------------------------------===//

#include "ernie/Export/ProgramFile.h"
#include "ernie/InitAll.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

using namespace mlir;

namespace {

//===----------------------------------------------------------------------===//
// What runs
//===----------------------------------------------------------------------===//

/// Pass pipelines an input may go through (ernie-opt's textual syntax). The
/// empty one is parse + verify only. Every successful one is followed by the
/// program writer.
const char *const kPipelines[] = {
    "",
    "ernie-auto-parallel-pipeline",
    "ernie-autodiff{optimizer=sgd},ernie-auto-parallel-pipeline",
    "ernie-autodiff{optimizer=adamw clip-norm=1.0},"
    "ernie-auto-parallel-pipeline",
    "ernie-pipeline-split{stages=2},ernie-shared-weight-dedup,"
    "ernie-autodiff{optimizer=adamw clip-norm=1.0},"
    "ernie-auto-parallel-pipeline,ernie-pipeline-schedule{micro-batches=2}",
    "ernie-pipeline-split{stages=2 virtual-stages=2},"
    "ernie-shared-weight-dedup,ernie-autodiff{optimizer=sgd},"
    "ernie-auto-parallel-pipeline,"
    "ernie-pipeline-schedule{micro-batches=4 schedule=interleaved}",
    "ernie-pipeline-schedule{micro-batches=2}",
    "canonicalize,cse",
};
constexpr unsigned kNumPipelines = std::size(kPipelines);

/// Every pipeline an input may get: kPipelines, then those the seeds' own
/// RUN lines give ernie-opt (so each pass is fuzzed on the inputs written
/// for it).
std::vector<std::string> pipelines(std::begin(kPipelines),
                                   std::end(kPipelines));

/// Inputs that crash MLIR 22's own parser (not ernie code, and not
/// fixable here): such inputs are counted as skipped, not run.
///  - `array<index: ...>`: Parser::parseDenseArrayAttr asks an index type
///    for its bit width (SIGSEGV in FloatType::getWidth).
const char *const kUpstreamCrashes[] = {"array<index"};

/// How far an input got (the child reports one per input).
enum Outcome : int32_t {
  kSkipped,
  kParseError,
  kVerifyError,
  kPassError,
  kCompiled,
  kNumOutcomes
};

//===----------------------------------------------------------------------===//
// Tokens and mutations
//===----------------------------------------------------------------------===//

enum class Tok { Space, Number, Ident, Value, Symbol, String, Punct };

struct Token {
  Tok kind;
  std::string text;
};

const char *const kElementTypes[] = {"f32",      "f64",    "f16", "bf16",
                                     "i64",      "i32",    "i1",  "index",
                                     "f8E4M3FN", "f8E5M2", "i8",  "f128"};

bool isElementType(StringRef s) { return llvm::is_contained(kElementTypes, s); }

bool isIdentChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' ||
         c == '$';
}

/// MLIR-ish lexing, good enough to mutate by: `4x8xf32` is 4, x, 8, x, f32.
std::vector<Token> tokenize(StringRef text) {
  std::vector<Token> tokens;
  size_t i = 0, n = text.size();
  while (i < n) {
    char c = text[i];
    size_t start = i;
    if (std::isspace(static_cast<unsigned char>(c))) {
      while (i < n && std::isspace(static_cast<unsigned char>(text[i])))
        ++i;
      tokens.push_back({Tok::Space, text.slice(start, i).str()});
    } else if (text.substr(i).starts_with("//")) {
      while (i < n && text[i] != '\n')
        ++i; // comments carry nothing the parser reads
    } else if (c == '"') {
      for (++i; i < n && text[i] != '"'; ++i)
        if (text[i] == '\\')
          ++i;
      i = std::min(n, i + 1);
      tokens.push_back({Tok::String, text.slice(start, i).str()});
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      if (text.substr(i).starts_with("0x")) {
        i += 2;
        while (i < n && std::isxdigit(static_cast<unsigned char>(text[i])))
          ++i;
      } else {
        while (i < n && (std::isdigit(static_cast<unsigned char>(text[i])) ||
                         text[i] == '.'))
          ++i;
        if (i + 1 < n && (text[i] == 'e' || text[i] == 'E') &&
            (std::isdigit(static_cast<unsigned char>(text[i + 1])) ||
             text[i + 1] == '-' || text[i + 1] == '+')) {
          i += 2;
          while (i < n && std::isdigit(static_cast<unsigned char>(text[i])))
            ++i;
        }
      }
      tokens.push_back({Tok::Number, text.slice(start, i).str()});
    } else if (c == '%' || c == '@' || c == '#' || c == '!' || c == '^') {
      for (++i; i < n && (isIdentChar(text[i]) || text[i] == '-'); ++i) {
      }
      if (c == '%' && i < n && text[i] == '#')
        for (++i; i < n && std::isdigit(static_cast<unsigned char>(text[i]));
             ++i) {
        }
      tokens.push_back({c == '%'   ? Tok::Value
                        : c == '@' ? Tok::Symbol
                                   : Tok::Ident,
                        text.slice(start, i).str()});
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      while (i < n && isIdentChar(text[i]))
        ++i;
      StringRef word = text.slice(start, i);
      // The dimension separator of a shape: `x8`, `xf32`.
      if (word.size() > 1 && word[0] == 'x' &&
          (std::isdigit(static_cast<unsigned char>(word[1])) ||
           isElementType(word.drop_front()) || word[1] == '?')) {
        tokens.push_back({Tok::Punct, "x"});
        i = start + 1;
        continue;
      }
      tokens.push_back({Tok::Ident, word.str()});
    } else if (text.substr(i).starts_with("->")) {
      i += 2;
      tokens.push_back({Tok::Punct, "->"});
    } else {
      ++i;
      tokens.push_back({Tok::Punct, std::string(1, c)});
    }
  }
  return tokens;
}

std::string join(const std::vector<Token> &tokens) {
  std::string text;
  for (const Token &t : tokens)
    text += t.text;
  return text;
}

/// Numbers a shape, an axis, an index or a count should never be.
const char *const kIntegers[] = {"0",
                                 "1",
                                 "2",
                                 "3",
                                 "7",
                                 "-1",
                                 "-2",
                                 "4294967296",
                                 "4294967295",
                                 "2147483648",
                                 "1048576",
                                 "1048577",
                                 "9223372036854775807",
                                 "-9223372036854775808",
                                 "99999999999999999999"};
const char *const kFloats[] = {
    "0.0",     "-0.0",       "1.0e+300",   "0.5",     "-1.0",   "1.0e-45",
    "3.4e+38", "0x7FC00000", "0x7F800000", "65504.0", "1.0e+39"};

const char *const kValues[] = {"0",     "-1",      "true",   "false",  "\"\"",
                               "\"x\"", "[]",      "[0]",    "[1, 0]", "{}",
                               "unit",  "0 : i64", "\"pp\"", "[-1]",   "1.5"};

const char *const kStrings[] = {"\"\"",       "\"pp\"",        "\"dp\"",
                                "\"mp\"",     "\"x\"",         "\"none\"",
                                "\"custom\"", "\"F0:0 B0:0\"", "\"F0:9\""};

class Mutator {
public:
  /// `valid`: the seeds that verify, mutated four times in five (the
  /// others are the invalid.mlir cases, which stop at the verifier).
  /// `native[i]`: indices into `pipelines` of seed i's RUN lines.
  Mutator(const std::vector<std::string> &seeds, std::vector<size_t> valid,
          std::vector<std::vector<unsigned>> native,
          std::vector<std::string> opNames)
      : seeds_(seeds), valid_(std::move(valid)), native_(std::move(native)),
        opNames_(std::move(opNames)) {
    std::set<std::string> words;
    for (const std::string &seed : seeds)
      for (const Token &t : tokenize(seed))
        if (t.kind != Tok::Space && t.text.size() < 64)
          words.insert(t.text);
    dictionary_.assign(words.begin(), words.end());
  }

  /// Input `index` under `seed`: its text and its pipeline.
  std::pair<std::string, std::string> make(uint64_t seed,
                                           uint64_t index) const {
    std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + index);
    size_t from = !valid_.empty() && rng() % 5 != 0
                      ? valid_[rng() % valid_.size()]
                      : rng() % seeds_.size();
    std::string text = seeds_[from];
    unsigned steps = 1;
    while (steps < 6 && rng() % 2)
      ++steps;
    for (unsigned s = 0; s < steps; ++s)
      text = mutateOnce(text, rng);
    const std::vector<unsigned> &own = native_[from];
    unsigned pipeline = static_cast<unsigned>(rng() % kNumPipelines);
    if (!own.empty() && rng() % 2)
      pipeline = own[rng() % own.size()];
    // Pass options are user input too: one in four gets a number changed.
    std::string options = pipelines[pipeline];
    if (rng() % 4 == 0) {
      std::vector<Token> tokens = tokenize(options);
      std::vector<size_t> numbers;
      for (size_t i = 0; i < tokens.size(); ++i)
        if (tokens[i].kind == Tok::Number)
          numbers.push_back(i);
      if (!numbers.empty()) {
        tokens[numbers[rng() % numbers.size()]].text = pick(kIntegers, rng);
        options = join(tokens);
      }
    }
    return {text, options};
  }

private:
  template <typename T, size_t N>
  static const char *pick(const T (&list)[N], std::mt19937_64 &rng) {
    return list[rng() % N];
  }

  /// Mutation kinds, weighted: most keep the input parseable (a value for
  /// a value, everywhere it occurs, so shapes stay consistent and the
  /// passes see it); a few break structure (deleted or duplicated tokens,
  /// lines).
  enum Kind {
    kNumberEverywhere,
    kNumberOnce,
    kNegate,
    kElementType,
    kOpName,
    kValueSwap,
    kExtraOperand,
    kDropOperand,
    kString,
    kAttrValue,
    kSwapSameKind,
    kDeleteToken,
    kDuplicateToken,
    kInsertWord,
    kLines,
  };
  static Kind pickKind(std::mt19937_64 &rng) {
    static const std::pair<Kind, unsigned> weights[] = {
        {kNumberEverywhere, 30}, {kNumberOnce, 10},  {kNegate, 2},
        {kElementType, 8},       {kOpName, 6},       {kValueSwap, 3},
        {kExtraOperand, 2},      {kDropOperand, 2},  {kString, 6},
        {kAttrValue, 8},         {kSwapSameKind, 4}, {kDeleteToken, 2},
        {kDuplicateToken, 1},    {kInsertWord, 1},   {kLines, 4}};
    unsigned total = 0;
    for (auto [kind, w] : weights)
      total += w;
    unsigned r = rng() % total;
    for (auto [kind, w] : weights) {
      if (r < w)
        return kind;
      r -= w;
    }
    return kNumberOnce;
  }

  /// Replaces every token with `from`'s text by `to`.
  static void replaceAll(std::vector<Token> &tokens, const std::string &from,
                         const std::string &to) {
    for (Token &t : tokens)
      if (t.text == from)
        t.text = to;
  }

  std::string mutateOnce(const std::string &text, std::mt19937_64 &rng) const {
    Kind kind = pickKind(rng);
    if (kind == kLines)
      return mutateLines(text, rng);
    std::vector<Token> tokens = tokenize(text);
    // The non-space tokens this kind applies to.
    auto applies = [&](const Token &t) {
      switch (kind) {
      case kNumberEverywhere:
      case kNumberOnce:
      case kNegate:
        return t.kind == Tok::Number;
      case kElementType:
        return isElementType(t.text);
      case kOpName:
        return StringRef(t.text).starts_with("ernie.");
      case kValueSwap:
      case kExtraOperand:
      case kDropOperand:
        return t.kind == Tok::Value;
      case kString:
        return t.kind == Tok::String;
      case kAttrValue:
        return t.text == "=";
      case kSwapSameKind:
        return t.kind == Tok::Number || t.kind == Tok::Value ||
               t.kind == Tok::Ident || t.kind == Tok::Symbol;
      default:
        return t.kind != Tok::Space;
      }
    };
    std::vector<size_t> where;
    size_t previous = 0; // the last non-space token
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i].kind == Tok::Space)
        continue;
      // `%0 = ernie.op` is a definition, not an attribute.
      if (applies(tokens[i]) &&
          !(kind == kAttrValue && i > 0 && tokens[previous].kind == Tok::Value))
        where.push_back(i);
      previous = i;
    }
    if (where.empty())
      return mutateLines(text, rng);
    size_t at = where[rng() % where.size()];
    Token &t = tokens[at];
    auto anyOf = [&](Tok k) {
      std::vector<std::string> texts;
      for (const Token &u : tokens)
        if (u.kind == k)
          texts.push_back(u.text);
      return texts[rng() % texts.size()];
    };
    auto nearby = [&](const std::string &number) -> std::string {
      if (StringRef(number).contains_insensitive('e') ||
          StringRef(number).contains('.'))
        return pick(kFloats, rng);
      long long n = std::atoll(number.c_str());
      switch (rng() % 4) {
      case 0:
        return std::to_string(n + 1);
      case 1:
        return std::to_string(n > 0 ? n - 1 : n);
      case 2:
        return std::to_string(n * 2);
      default:
        return pick(kIntegers, rng);
      }
    };
    switch (kind) {
    case kNumberEverywhere:
      replaceAll(tokens, std::string(t.text), nearby(t.text));
      break;
    case kNumberOnce:
      t.text = nearby(t.text);
      break;
    case kNegate:
      t.text = "-" + t.text;
      break;
    case kElementType:
      if (rng() % 5 != 0)
        replaceAll(tokens, std::string(t.text), pick(kElementTypes, rng));
      else
        t.text = pick(kElementTypes, rng);
      break;
    case kOpName:
      if (!opNames_.empty())
        t.text = opNames_[rng() % opNames_.size()];
      break;
    case kValueSwap:
      t.text = anyOf(Tok::Value);
      break;
    case kExtraOperand:
      t.text += ", " + anyOf(Tok::Value);
      break;
    case kDropOperand:
      // With the comma before or after it.
      t.text.clear();
      for (size_t v = at + 1; v < tokens.size(); ++v)
        if (tokens[v].kind != Tok::Space) {
          if (tokens[v].text == ",")
            tokens[v].text.clear();
          break;
        }
      break;
    case kString:
      if (rng() % 2)
        replaceAll(tokens, std::string(t.text), pick(kStrings, rng));
      else
        t.text = pick(kStrings, rng);
      break;
    case kAttrValue:
      for (size_t v = at + 1; v < tokens.size(); ++v)
        if (tokens[v].kind != Tok::Space) {
          tokens[v].text = pick(kValues, rng);
          break;
        }
      break;
    case kSwapSameKind: {
      size_t other = rng() % tokens.size();
      if (tokens[other].kind == t.kind)
        std::swap(t.text, tokens[other].text);
      break;
    }
    case kDeleteToken:
      t.text.clear();
      break;
    case kDuplicateToken: {
      Token copy = t;
      tokens.insert(tokens.begin() + at + 1, {{Tok::Space, " "}, copy});
      break;
    }
    case kInsertWord:
      tokens.insert(tokens.begin() + at,
                    {{Tok::Ident, dictionary_[rng() % dictionary_.size()]},
                     {Tok::Space, " "}});
      break;
    case kLines:
      break;
    }
    return join(tokens);
  }

  std::string mutateLines(const std::string &text, std::mt19937_64 &rng) const {
    SmallVector<StringRef> lines;
    StringRef(text).split(lines, '\n');
    std::vector<std::string> out(lines.begin(), lines.end());
    if (out.empty())
      return text;
    size_t i = rng() % out.size(), j = rng() % out.size();
    switch (rng() % 4) {
    case 0:
      out.erase(out.begin() + i);
      break;
    case 1:
      out.insert(out.begin() + i, out[j]);
      break;
    case 2:
      std::swap(out[i], out[j]);
      break;
    case 3: {
      // A line of another seed.
      SmallVector<StringRef> other;
      StringRef(seeds_[rng() % seeds_.size()]).split(other, '\n');
      out.insert(out.begin() + i, other[rng() % other.size()].str());
      break;
    }
    }
    return llvm::join(out, "\n");
  }

  const std::vector<std::string> &seeds_;
  std::vector<size_t> valid_;
  std::vector<std::vector<unsigned>> native_;
  std::vector<std::string> opNames_;
  std::vector<std::string> dictionary_;
};

//===----------------------------------------------------------------------===//
// Running one input
//===----------------------------------------------------------------------===//

Outcome runInput(DialectRegistry &registry, const std::string &text,
                 const std::string &pipeline) {
  for (const char *pattern : kUpstreamCrashes)
    if (StringRef(text).contains(pattern))
      return kSkipped;
  MLIRContext context(registry, MLIRContext::Threading::DISABLED);
  // Only "no crash, no hang" is checked: diagnostics are dropped.
  ScopedDiagnosticHandler quiet(&context,
                                [](Diagnostic &) { return success(); });
  ParserConfig config(&context, /*verifyAfterParse=*/false);
  OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(text, config);
  if (!module)
    return kParseError;
  if (failed(verify(*module)))
    return kVerifyError;
  // The module's own pass manager, its passes listed as in
  // --pass-pipeline=builtin.module(...).
  PassManager pm(&context);
  std::string errors;
  llvm::raw_string_ostream errorStream(errors);
  if (failed(parsePassPipeline(pipeline, pm, errorStream)))
    return kPassError; // a mutated option the pass refuses

  if (failed(pm.run(*module)))
    return kPassError;
  std::string program;
  llvm::raw_string_ostream os(program);
  if (failed(ernie::writeProgramFile(*module, os)))
    return kPassError;
  return kCompiled;
}

//===----------------------------------------------------------------------===//
// Seeds, batches, crashes
//===----------------------------------------------------------------------===//

void collectSeeds(StringRef path, std::vector<std::string> &files) {
  if (llvm::sys::fs::is_directory(path)) {
    std::error_code ec;
    for (llvm::sys::fs::recursive_directory_iterator it(path, ec), end;
         it != end && !ec; it.increment(ec))
      if (llvm::sys::path::extension(it->path()) == ".mlir" &&
          !llvm::sys::fs::is_directory(it->path()))
        files.push_back(it->path());
    return;
  }
  files.push_back(path.str());
}

/// The pass pipeline of a lit RUN line's `ernie-opt %s --a --b=x "--c=y z"`
/// in --pass-pipeline syntax (`a,b{x},c{y z}`), or "" when it runs none.
/// Flags that are not passes are dropped here; whether the rest parse is
/// checked by the caller. `%S` in an option is the seed file's directory
/// (`directory`), as lit substitutes it: a pass reading a cluster file
/// (`cluster=%S/Inputs/...`) then runs with it instead of failing to open
/// it, so cost-driven propagation is fuzzed too.
std::string pipelineOfRunLine(StringRef line, StringRef directory) {
  size_t at = line.find("ernie-opt %s");
  if (at == StringRef::npos)
    return "";
  StringRef rest = line.substr(at + strlen("ernie-opt %s"));
  rest = rest.take_until([](char c) { return c == '|' || c == '>'; });
  std::vector<std::string> words;
  std::string word;
  bool quoted = false;
  for (char c : rest) {
    if (c == '"') {
      quoted = !quoted;
    } else if (std::isspace(static_cast<unsigned char>(c)) && !quoted) {
      if (!word.empty())
        words.push_back(word);
      word.clear();
    } else {
      word += c;
    }
  }
  if (!word.empty())
    words.push_back(word);
  std::vector<std::string> passes;
  for (StringRef w : std::vector<StringRef>(words.begin(), words.end())) {
    if (!w.consume_front("--") && !w.consume_front("-"))
      continue; // an operand, a redirection's target
    auto [name, options] = w.split('=');
    if (name.starts_with("mlir-") || name == "split-input-file" ||
        name == "verify-diagnostics" || name == "o" || name == "2" ||
        name == "emit-bytecode" || name == "pass-pipeline")
      continue;
    std::string element = name.str();
    if (!options.empty()) {
      // Files a pass writes (plan reports) go nowhere.
      std::string opts = options.str();
      size_t t = opts.find("%t");
      if (t != std::string::npos) {
        size_t end = opts.find(' ', t);
        opts.replace(t, end == std::string::npos ? std::string::npos : end - t,
                     "/dev/null");
      }
      for (size_t d = opts.find("%S"); d != std::string::npos;
           d = opts.find("%S", d + directory.size()))
        opts.replace(d, 2, directory.str());
      element += "{" + opts + "}";
    }
    passes.push_back(element);
  }
  return llvm::join(passes, ",");
}

struct SeedPiece {
  std::string text;
  /// The pipelines of its file's RUN lines.
  std::vector<std::string> runPipelines;
};

/// The seed texts: each file cut into its split-input-file pieces.
std::vector<SeedPiece> loadSeeds(std::vector<std::string> files) {
  llvm::sort(files); // the corpus order makes inputs reproducible
  std::vector<SeedPiece> seeds;
  for (const std::string &file : files) {
    auto buffer = llvm::MemoryBuffer::getFile(file);
    if (!buffer)
      continue;
    std::string piece;
    std::set<std::string> runs;
    SmallVector<StringRef> lines;
    (*buffer)->getBuffer().split(lines, '\n');
    size_t first = seeds.size();
    for (StringRef line : lines) {
      if (line.starts_with("// -----") || line.starts_with("//---")) {
        if (!StringRef(piece).trim().empty())
          seeds.push_back({piece, {}});
        piece.clear();
        continue;
      }
      if (line.trim().starts_with("//")) {
        if (line.contains("RUN:"))
          if (std::string p =
                  pipelineOfRunLine(line, llvm::sys::path::parent_path(file));
              !p.empty())
            runs.insert(p);
        continue;
      }
      piece += line.str() + "\n";
    }
    if (!StringRef(piece).trim().empty())
      seeds.push_back({piece, {}});
    for (size_t i = first; i < seeds.size(); ++i)
      seeds[i].runPipelines.assign(runs.begin(), runs.end());
  }
  return seeds;
}

struct Report {
  int64_t index;
  int32_t outcome; // -1: starting
};

/// Runs inputs [begin, end) in this (child) process, reporting on `fd`.
[[noreturn]] void runBatch(DialectRegistry &registry, const Mutator &mutator,
                           uint64_t seed, int64_t begin, int64_t end, int fd,
                           unsigned timeLimit) {
  for (int64_t i = begin; i < end; ++i) {
    auto [text, pipeline] = mutator.make(seed, i);
    Report start{i, -1};
    if (write(fd, &start, sizeof(start)) != sizeof(start))
      _exit(3);
    alarm(timeLimit); // a hang dies of SIGALRM
    Report done{i, runInput(registry, text, pipeline)};
    alarm(0);
    if (write(fd, &done, sizeof(done)) != sizeof(done))
      _exit(3);
  }
  _exit(0);
}

std::string describeStatus(int status) {
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    return sig == SIGALRM ? "hang (time limit)"
                          : std::string("signal ") + strsignal(sig);
  }
  return "exit code " + std::to_string(WEXITSTATUS(status));
}

int64_t envOr(const char *name, int64_t fallback) {
  const char *value = std::getenv(name);
  return value && *value ? std::atoll(value) : fallback;
}

} // namespace

int main(int argc, char **argv) {
  int64_t iterations = 2000, maxSeconds = 0, printInput = -1, first = 0;
  bool listPipelines = false, verbose = false;
  uint64_t seed = 1;
  unsigned timeLimit = 20;
  std::string crashDir = ".";
  std::vector<std::string> files;
  for (int a = 1; a < argc; ++a) {
    StringRef arg = argv[a];
    auto value = [&]() -> std::string {
      if (a + 1 >= argc) {
        llvm::errs() << "ernie-fuzz-mlir: " << arg << " needs a value\n";
        std::exit(2);
      }
      return argv[++a];
    };
    if (arg == "--iterations")
      iterations = std::atoll(value().c_str());
    else if (arg == "--seed")
      seed = std::strtoull(value().c_str(), nullptr, 10);
    else if (arg == "--crash-dir")
      crashDir = value();
    else if (arg == "--time-limit")
      timeLimit = std::atoi(value().c_str());
    else if (arg == "--max-seconds")
      maxSeconds = std::atoll(value().c_str());
    else if (arg == "--verbose")
      verbose = true;
    else if (arg == "--list-pipelines")
      listPipelines = true;
    else if (arg == "--first")
      first = std::atoll(value().c_str());
    else if (arg == "--print-input")
      printInput = std::atoll(value().c_str());
    else if (arg.starts_with("-")) {
      llvm::errs() << "ernie-fuzz-mlir: unknown option " << arg << "\n";
      return 2;
    } else
      collectSeeds(arg, files);
  }
  if (const char *env = std::getenv("ERNIE_FUZZ_ITERATIONS"); env && *env) {
    iterations = std::atoll(env);
    maxSeconds = 0;
  }
  seed = envOr("ERNIE_FUZZ_SEED", seed);
  std::vector<SeedPiece> pieces = loadSeeds(files);
  std::vector<std::string> seeds;
  for (const SeedPiece &piece : pieces)
    seeds.push_back(piece.text);
  if (seeds.empty()) {
    llvm::errs() << "ernie-fuzz-mlir: no seed inputs (.mlir) given\n";
    return 2;
  }

  ernie::registerAllPasses();
  DialectRegistry registry;
  ernie::registerAllDialects(registry);
  std::vector<std::string> opNames;
  {
    MLIRContext context(registry);
    context.loadAllAvailableDialects();
    for (RegisteredOperationName name : context.getRegisteredOperations())
      if (name.getStringRef().starts_with("ernie."))
        opNames.push_back(name.getStringRef().str());
  }
  std::vector<size_t> valid;
  for (size_t i = 0; i < seeds.size(); ++i) {
    MLIRContext context(registry, MLIRContext::Threading::DISABLED);
    ScopedDiagnosticHandler quiet(&context,
                                  [](Diagnostic &) { return success(); });
    if (parseSourceString<ModuleOp>(seeds[i], &context))
      valid.push_back(i);
  }
  // The seeds' RUN-line pipelines that parse, each once.
  std::vector<std::vector<unsigned>> native(pieces.size());
  std::map<std::string, unsigned> known;
  for (auto [i, piece] : llvm::enumerate(pieces))
    for (const std::string &p : piece.runPipelines) {
      auto [it, inserted] = known.try_emplace(p, pipelines.size());
      if (inserted) {
        MLIRContext context(registry);
        PassManager pm(&context);
        std::string errors;
        llvm::raw_string_ostream os(errors);
        if (failed(parsePassPipeline(p, pm, os))) {
          it->second = ~0u;
          continue;
        }
        pipelines.push_back(p);
      }
      if (it->second != ~0u)
        native[i].push_back(it->second);
    }
  Mutator mutator(seeds, valid, native, opNames);
  if (listPipelines) {
    for (const std::string &p : pipelines)
      llvm::outs() << "builtin.module(" << p << ")\n";
    return 0;
  }
  if (printInput >= 0) {
    // The input a crash report names, to replay outside the harness.
    auto [text, pipeline] = mutator.make(seed, printInput);
    llvm::outs() << "// pipeline: builtin.module(" << pipeline << ")\n" << text;
    return 0;
  }

  int64_t counts[kNumOutcomes] = {};
  int64_t crashes = 0, ran = 0;
  const int64_t batch = 500;
  auto started = std::chrono::steady_clock::now();
  // Inputs [first, first + iterations): --first replays one by its number.
  iterations += first;
  int64_t next = first;
  while (next < iterations) {
    if (maxSeconds > 0 && std::chrono::steady_clock::now() - started >
                              std::chrono::seconds(maxSeconds))
      break;
    int64_t end = std::min(iterations, next + batch);
    int fds[2];
    if (pipe(fds) != 0) {
      perror("pipe");
      return 2;
    }
    pid_t child = fork();
    if (child < 0) {
      perror("fork");
      return 2;
    }
    if (child == 0) {
      close(fds[0]);
      // A runaway allocation ends this child, not the machine.
      rlimit memory{int64_t(4) << 30, int64_t(4) << 30};
      setrlimit(RLIMIT_AS, &memory);
      // Option parsers print their complaints; a crash is reported by the
      // parent, and --verbose keeps the child's stack dumps.
      if (!verbose)
        if (FILE *null = std::freopen("/dev/null", "w", stderr); !null)
          _exit(3);
      runBatch(registry, mutator, seed, next, end, fds[1], timeLimit);
    }
    close(fds[1]);
    Report report;
    int64_t running = -1;
    while (read(fds[0], &report, sizeof(report)) == sizeof(report)) {
      if (report.outcome < 0) {
        running = report.index;
        continue;
      }
      ++counts[report.outcome];
      ++ran;
      running = -1;
    }
    close(fds[0]);
    int status = 0;
    waitpid(child, &status, 0);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      next = end;
      continue;
    }
    if (running < 0) {
      llvm::errs() << "ernie-fuzz-mlir: batch from " << next << " died ("
                   << describeStatus(status) << ") between inputs\n";
      return 2;
    }
    ++crashes;
    ++ran;
    auto [text, pipeline] = mutator.make(seed, running);
    std::string path = crashDir + "/ernie-fuzz-mlir-crash-" +
                       std::to_string(seed) + "-" + std::to_string(running) +
                       ".mlir";
    std::error_code ec;
    llvm::raw_fd_ostream out(path, ec);
    if (!ec) {
      out << "// ernie-fuzz-mlir --seed " << seed << ": input " << running
          << ", " << describeStatus(status) << "\n// ernie-opt FILE "
          << "'--pass-pipeline=builtin.module(" << pipeline
          << ")' | ernie-translate --ernie-to-program -o /dev/null\n"
          << text;
    }
    llvm::errs() << "ernie-fuzz-mlir: input " << running << " "
                 << describeStatus(status) << " under '" << pipeline
                 << "': written to " << path << "\n";
    next = running + 1;
  }
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started)
          .count();
  llvm::outs() << "ernie-fuzz-mlir: " << ran << " inputs (seed " << seed << ", "
               << seeds.size() << " seed pieces, " << valid.size() << " valid, "
               << pipelines.size() << " pipelines) in "
               << llvm::format("%.1f", seconds) << " s: " << counts[kSkipped]
               << " skipped (known MLIR parser crashes), "
               << counts[kParseError] << " parse errors, "
               << counts[kVerifyError] << " verifier errors, "
               << counts[kPassError] << " pass/writer errors, "
               << counts[kCompiled] << " compiled; " << crashes
               << " crashes or hangs\n";
  return crashes == 0 ? 0 : 1;
}
