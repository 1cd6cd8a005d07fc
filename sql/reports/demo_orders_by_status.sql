-- report: demo_orders_by_status
-- description: orders and revenue per status of the demo table, above a minimum amount
-- target: reports.demo_orders_by_status
-- sink: postgres
-- schedule: */5 * * * *
-- param: min_amount decimal(12,2) = 0
SELECT status,
       count(*)    AS orders,
       sum(amount) AS revenue
FROM demo_orders
WHERE amount >= :min_amount
GROUP BY status
