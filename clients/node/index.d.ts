export class RatewardenError extends Error {}

export interface RulePart {
  rule: string;
  key: string;
  allowed: boolean;
  shadow: boolean;
  limit: number;
  remaining: number;
  reset_after: number;
  retry_after: number | null;
  reason: string | null;
  lease: number | null;
  count: 'all' | 'failures';
  failure_status: Array<[number, number]> | null;
}

export interface Decision {
  allowed: boolean;
  retryAfter: number | null;
  remaining?: number | null;
  limit?: number | null;
  resetAfter?: number | null;
  rule?: string | null;
  reason?: string | null;
  lease?: number | null;
  headers: Record<string, string>;
  rules: RulePart[];
  status?: number | null;
  problem?: Record<string, unknown> | null;
  /** True when the gateway gave no answer and `onError` decided. */
  unanswered: boolean;
}

export interface ClientOptions {
  /** The admin listener's URL: `http://127.0.0.1:9090`. */
  url: string;
  token?: string;
  /** Milliseconds (250). */
  timeout?: number;
  onError?: 'allow' | 'deny';
  log?: (message: string) => void;
}

export interface RequestDescription {
  method?: string;
  path?: string;
  headers?: Record<string, string>;
  peer?: string;
  identity?: string;
  host?: string;
  query?: string;
  body?: unknown;
  cost?: number;
}

export interface Client {
  ping(): Promise<void>;
  check(rule: string, key: string, options?: { cost?: number; identity?: string }): Promise<Decision>;
  checkRequest(request: RequestDescription): Promise<Decision>;
  report(rule: string, key: string, fields?: Record<string, unknown>): Promise<Record<string, unknown> | null>;
  settle(decision: Decision, status: number): Promise<void>;
  release(decision: Decision): Promise<void>;
  explain(params?: Record<string, string>): Promise<Record<string, unknown>>;
}

export function createClient(options: ClientOptions): Client;
export function settleOutcome(part: RulePart, status: number): 'failure' | 'success' | null;

export interface RateLimitOptions {
  client: Client;
  rule?: string;
  request?: boolean;
  key?: (req: any) => string;
}

export function rateLimit(options: RateLimitOptions): (req: any, res: any, next: (err?: unknown) => void) => void;

declare const _default: {
  createClient: typeof createClient;
  rateLimit: typeof rateLimit;
  settleOutcome: typeof settleOutcome;
  RatewardenError: typeof RatewardenError;
};
export default _default;
